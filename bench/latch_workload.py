"""Record the demo's latch workload: the shipped trace ``traces/latch-abort-live.trace``.

fcfs under the KV-pressure arguments, sent with the re-drive sender
(``schedtrace.tracer.sandbox.redrive``) to a fresh sandbox recording a trace:

* four long requests take most of the KV pool and keep it for their whole
  decode (two of them share a 1600-token prefix);
* a large head H that does not fit arrives next: ``NO_TOKEN`` latches
  ``batch_is_full``, and small requests queue behind it;
* the client gives up on H: it leaves the queue, the small head now fits, but
  the stock scheduler keeps the latched flag until a long request finishes,
  so it admits nothing for that whole decode (a stall); the ``latch`` fix
  admits them at once.

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
LONG_OUT = 400  # the long requests' decode: the stall's length under stock
HEAD_AT_MS, HEAD_LEN, HEAD_ABORT_MS = 6000, 16000, 2000
SMALL_FROM_MS, SMALL_EVERY_MS, SMALL = 6500, 500, 6


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

    f_len = PREFIX_BLOCKS * BLOCK
    requests = [request(0, f_len + 48, LONG_OUT, prefix=True), request(200, 8000, LONG_OUT, prefix=True)]
    requests += [request(200 * (i + 2), 8000, LONG_OUT) for i in range(2)]
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
