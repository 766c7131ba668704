"""Record the demo's latch workload: the shipped trace ``traces/latch-abort-live.trace``.

fcfs under the KV-pressure arguments, sent with the re-drive sender
(``schedtrace.tracer.sandbox.redrive``) to a fresh sandbox recording a trace.
The stall is held by the clock, not by the CPU's speed: each request leaves
when its client drops it, and sglang sees a drop on its 4 s disconnect poll,
whatever the machine does meanwhile:

* two long requests (10,000 tokens each, sharing a 1600-token prefix) ask
  for 6000 tokens each with ``ignore_eos``; the client drops them, and the
  scheduler sees it 12 s after their arrival. They hold the KV pool until
  then on a fast CPU (6000 decode steps outlast 12 s at 2 ms a step) as on
  a loaded one;
* a large head H arrives next. It never fits while they run: sglang's
  budget is the pool less their inputs, their outputs so far and the outputs
  they may still make (``ignore_eos`` reserves them all, up to 4096 each),
  at most 13,408 tokens, and H needs 16,016. ``NO_TOKEN`` latches
  ``batch_is_full``, and small requests queue behind H;
* the client gives up on H (the scheduler sees it 4 s after its arrival): it
  leaves the queue, the small head now fits, but the stock scheduler keeps
  the latched flag until a long request leaves, so it admits nothing for
  about 5.5 s (a stall); the ``latch`` fix admits them at once.

The abort times are the scheduler's, as a recording has them: the sender
drops each connection a little before (``ABORT_LEAD_S``), so the poll sees
it then, in this recording and in a re-drive of it alike.

    python -m bench.latch_workload OUT_DIR      # prints the trace it recorded

traces/README.md says how the shipped copy was made.
"""

from __future__ import annotations

import sys
from pathlib import Path

from schedtrace.tracer.analysis.workload import Workload, WorkloadRequest
from schedtrace.tracer.contract.prefix_ids import PREFIX_BLOCK_TOKENS, id_count
from schedtrace.tracer.sandbox.redrive import plan, redrive, server_vocab
from schedtrace.tracer.sandbox.server import KV_PRESSURE_ARGS, SandboxServer

LAUNCH_ARGS = KV_PRESSURE_ARGS
BLOCK = PREFIX_BLOCK_TOKENS
PREFIX_BLOCKS = 100  # F: 1600 tokens
LONG_LEN, LONG_OUT, LONG_ABORT_MS = 10_000, 6000, 12_000  # within the model's 16,384-token context
HEAD_AT_MS, HEAD_LEN, HEAD_ABORT_MS = 2500, 16_000, 4000
SMALL_FROM_MS, SMALL_EVERY_MS, SMALL = 3000, 400, 6


def latch_workload() -> Workload:
    next_id = PREFIX_BLOCKS  # hash ids 0..99 are F's blocks

    def request(t_ms: float, input_len: int, out: int, prefix: bool = False,
                abort_ms: float | None = None) -> WorkloadRequest:
        nonlocal next_id
        shared = PREFIX_BLOCKS if prefix else 0
        own = id_count(input_len, BLOCK) - shared
        ids = list(range(shared)) + list(range(next_id, next_id + own))
        next_id += own
        return WorkloadRequest(t_ms=t_ms, input_len=input_len, output_len=out, hash_ids=ids, max_new_tokens=out,
                               ignore_eos=True, priority=None, finish_reason="abort" if abort_ms else "length",
                               client_abort_ms=abort_ms)

    requests = [request(200 * i, LONG_LEN, LONG_OUT, prefix=True, abort_ms=LONG_ABORT_MS) for i in range(2)]
    requests.append(request(HEAD_AT_MS, HEAD_LEN, 16, abort_ms=HEAD_ABORT_MS))
    requests += [request(SMALL_FROM_MS + SMALL_EVERY_MS * i, 600, 16) for i in range(SMALL)]
    return Workload(block=BLOCK, shared_prefixes=True, requests=requests)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.exit("usage: python -m bench.latch_workload OUT_DIR")
    out = Path(argv[0]).resolve()
    workload = latch_workload()
    with SandboxServer(trace_dir=out / "traces", extra_args=LAUNCH_ARGS, log_path=out / "server.log") as server:
        result = redrive(server.url, plan(workload, rid_prefix="latch-"), workload.block, server_vocab(server.url))
    print(result.summary(), file=sys.stderr)
    for path in sorted((out / "traces").glob("*.trace")):
        print(path)
    return 0 if result.failed == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
