"""The policy-matrix load: shared-prefix families arriving together, priorities and client aborts.

Sent straight to ``/generate`` as ``input_ids`` (exact lengths and shared
prefixes, which bench_serving's random datasets cannot give), bounded in
count and time, to a server on this machine only. ``CONFIGS`` are the policy
matrix's servers (tests/test_policy_matrix.py); run one alone, recording, with
``python tests/policy_load.py NAME OUT_DIR``.
"""

from __future__ import annotations

import json
import random
import shutil
import socket
import time
import urllib.error
import urllib.request
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from schedtrace.tracer.sandbox.server import SandboxServer

VOCAB = 512  # the sandbox models' vocabulary


@dataclass(frozen=True)
class Request:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    priority: int | None = None
    abort_after_s: float | None = None  # the client drops the connection after this long
    delay_s: float = 0.0  # sent this long after the load starts
    routing_key: str | None = None


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def policy_requests(tag: str, *, priorities: bool = False, aborts: int = 2, seed: int = 0,
                    routing: bool = False) -> list[Request]:
    """Families of 4 sharing a 600-token prefix (arriving together), singles, and ``aborts`` aborts.

    ``routing``: each family shares a routing key (the routing-key policy's input)."""
    rng = random.Random(f"{tag}-{seed}")
    out: list[Request] = []
    for wave in range(3):
        for family in range(2):
            prefix = _ids(rng, 600)
            for member in range(4):
                prio = rng.randrange(0, 3) if priorities else None
                out.append(Request(f"{tag}-w{wave}f{family}m{member}", prefix + _ids(rng, rng.randrange(40, 400)),
                                   rng.randrange(8, 40), prio, delay_s=wave * 1.5,
                                   routing_key=f"family-{family}" if routing else None))
        for single in range(4):
            prio = rng.randrange(0, 3) if priorities else None
            out.append(Request(f"{tag}-w{wave}s{single}", _ids(rng, rng.randrange(100, 1800)),
                               rng.randrange(8, 48), prio, delay_s=wave * 1.5 + 0.2 * single))
    for n in range(aborts):
        out.append(Request(f"{tag}-abort{n}", _ids(rng, 3000), 400, 0 if priorities else None,
                           abort_after_s=1.0, delay_s=0.5 + n))
    return out


def send(url: str, request: Request, timeout_s: float = 300.0) -> str:
    """'ok', 'aborted' (the client gave up, as planned), or 'failed: ...'."""
    params = {"max_new_tokens": request.max_new_tokens, "ignore_eos": True}
    body: dict = {"rid": request.rid, "input_ids": request.input_ids, "sampling_params": params}
    if request.priority is not None:
        body["priority"] = request.priority
    if request.routing_key is not None:
        body["routing_key"] = request.routing_key
    http = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                  headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(http, timeout=request.abort_after_s or timeout_s) as resp:
            resp.read()
        return "ok"
    except (TimeoutError, socket.timeout):
        return "aborted" if request.abort_after_s else "failed: timeout"
    except urllib.error.URLError as exc:
        if request.abort_after_s and isinstance(exc.reason, (TimeoutError, socket.timeout)):
            return "aborted"
        return f"failed: {exc}"


def run(url: str, requests: list[Request], workers: int = 24) -> dict[str, str]:
    """Send every request at its delay, concurrently; rid -> outcome."""
    start = time.monotonic()

    def one(request: Request) -> tuple[str, str]:
        time.sleep(max(0.0, request.delay_s - (time.monotonic() - start)))
        return request.rid, send(url, request)

    with ThreadPoolExecutor(workers) as pool:
        return dict(pool.map(one, sorted(requests, key=lambda r: r.delay_s)))


BASE_ARGS = ("--max-running-requests", "4", "--chunked-prefill-size", "1024", "--max-total-tokens", "12000")
PRIORITY = ("--enable-priority-scheduling",)


@dataclass(frozen=True)
class Config:
    name: str
    args: tuple[str, ...]
    model: str = "llama"
    env: dict[str, str] = field(default_factory=dict)
    priorities: bool = False
    routing: bool = False


CONFIGS = (
    # lpm with mixed chunks, a per-pass request cap and a queue limit that rejects
    Config("lpm", ("--schedule-policy", "lpm", "--enable-mixed-chunk", "--prefill-max-requests", "3",
                   "--max-queued-requests", "14")),
    # dfs-weight under sglang's retraction test hook, two decode steps per pass
    Config("dfs-weight", ("--schedule-policy", "dfs-weight", "--num-continuous-decode-steps", "2"),
           env={"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "7"}),
    Config("hrrn", ("--schedule-policy", "hrrn")),
    Config("shortest-prefill-first", ("--schedule-policy", "shortest-prefill-first")),
    Config("random", ("--schedule-policy", "random")),
    Config("routing-key", ("--schedule-policy", "routing-key"), routing=True),
    # priorities, no preemption
    Config("lof-priority", ("--schedule-policy", "lof", *PRIORITY, "--disable-priority-preemption"), priorities=True),
    # priorities, low values first, preempting at any priority difference
    Config("fcfs-low-first", ("--schedule-policy", "fcfs", *PRIORITY, "--schedule-low-priority-values-first",
                              "--priority-scheduling-preemption-threshold", "0"), priorities=True),
    Config("mamba-lpm", ("--schedule-policy", "lpm"), model="hybrid-mamba"),
)


@dataclass
class Recorded:
    config: Config
    trace: Path
    outcomes: dict[str, str]


def record(config: Config, base: Path) -> Recorded:
    """Serve the load on ``config``'s sandbox, recording into ``base/NAME/traces``."""
    folder = base / config.name
    shutil.rmtree(folder, ignore_errors=True)  # one trace per configuration
    args = BASE_ARGS if config.model == "llama" else ()
    server = SandboxServer(model=config.model, overload=config.model != "llama", trace_dir=folder / "traces",
                           extra_args=(*args, *config.args), log_path=folder / "server.log", env=config.env)
    with server:
        outcomes = run(server.url, policy_requests(config.name, priorities=config.priorities, routing=config.routing))
    (trace,) = sorted((folder / "traces").glob("*.trace"))
    return Recorded(config, trace, outcomes)


if __name__ == "__main__":
    by_name = {c.name: c for c in CONFIGS}
    if len(sys.argv) != 3 or sys.argv[1] not in by_name:
        sys.exit(f"usage: python tests/policy_load.py {{{','.join(by_name)}}} OUT_DIR")
    done = record(by_name[sys.argv[1]], Path(sys.argv[2]))
    print(done.trace)
