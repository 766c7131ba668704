"""A timed load of shared-prefix families, singles, priorities and client aborts.

Sent straight to ``/generate`` as ``input_ids`` (exact lengths and shared
prefixes, which bench_serving's random datasets cannot give), bounded in
count and time, to a server on this machine only.
"""

from __future__ import annotations

import json
import random
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from schedtrace.testing.requests import FIRST_WORD, VOCAB_SIZE

# sglang's tokenizer notices a dropped client only when it polls, every
# SGLANG_REQUEST_STATE_WAIT_TIMEOUT seconds (4 by default); an aborting request
# must still be running by then, or the scheduler never sees its abort.
ABORT_POLL_ENV = {"SGLANG_REQUEST_STATE_WAIT_TIMEOUT": "1"}
ABORT_INPUT_LEN = 3000
ABORT_NEW_TOKENS = 3000  # far more than a CPU sandbox decodes before the poll
FAMILY_PREFIX = 600  # tokens a family's prompts share

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
    return [rng.randrange(FIRST_WORD, VOCAB_SIZE) for _ in range(n)]


def policy_requests(tag: str, *, priorities: bool = False, aborts: int = 2, seed: int = 0,
                    routing: bool = False) -> list[Request]:
    """Families of 4 sharing a 600-token prefix (arriving together), singles, and ``aborts`` aborts.

    ``routing``: each family shares a routing key (the routing-key policy's input)."""
    rng = random.Random(f"{tag}-{seed}")
    out: list[Request] = []
    for wave in range(3):
        for family in range(2):
            prefix = _ids(rng, FAMILY_PREFIX)
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
        out.append(Request(f"{tag}-abort{n}", _ids(rng, ABORT_INPUT_LEN), ABORT_NEW_TOKENS, 0 if priorities else None,
                           abort_after_s=1.0, delay_s=0.5 + n))
    return _distinct_first_words(out)


def _distinct_first_words(requests: list[Request]) -> list[Request]:
    """Each prompt begins with a word of its own, and a family's prompts with the family's. In a
    512-word vocabulary random prompts share a first word by chance, and such a one-token match
    makes a tree branch no prefix id can name (docs/closed-loop.md, the dfs-weight ties); real
    prompts share a template or nothing."""
    words: dict[tuple[int, ...], int] = {}  # a prompt's family prefix -> its first word
    for request in requests:
        family = tuple(request.input_ids[:FAMILY_PREFIX])
        request.input_ids[0] = words.setdefault(family, FIRST_WORD + len(words))
    return requests


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
