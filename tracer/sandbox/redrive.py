"""Re-drive a recorded workload: send its requests again to any sglang server, open loop.

Each request goes to ``/generate`` as ``input_ids`` of its exact input
length, made from its hash ids (``tokens_for``): block k's tokens come from
block k's id alone, so requests that shared a prefix block share it again
and no original token is needed. It asks for the tokens it produced
(``WorkloadRequest.redrive_max_new_tokens``) with ``ignore_eos``, keeps its
priority, and is sent at its recorded arrival time divided by the speed-up,
whatever the earlier requests are doing. A recorded client abort drops the
connection ``ABORT_LEAD_S`` before its recorded time after the send: sglang
notices a dropped connection only on its next poll
(``SGLANG_REQUEST_STATE_WAIT_TIMEOUT``, 4 s by default, counted from the
request's arrival), so the recorded time is that poll's, and a drop at the
poll itself would race it and most often land one poll (4 s) later. Dropped
a little before, it lands on the recording's poll.

``plan`` is pure; ``redrive`` does the sending, one thread per request in
flight; ``server_vocab`` asks the server what it serves. A server that
refuses, or stops answering part way, ends the run with
``EndpointUnreachableError`` naming the URL once every request is settled.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from schedtrace.tracer.analysis.workload import REFUSED_FINISH, Workload, WorkloadRequest
from schedtrace.tracer.contract.errors import EndpointUnreachableError, UsageError

LOWEST_TOKEN: Final = 3  # ids below are bos/eos/pad in most vocabularies
TOKEN_KEY: Final = b"schedtrace-redrive"  # the ids' stream is fixed: the same trace gives the same prompts
ABORT_LEAD_S: Final = 1.0  # a recorded abort's drop comes this much before its time (at least 0)
MAX_IN_FLIGHT: Final = 1024  # requests open at once; later sends wait (and count as late)
REQUEST_TIMEOUT_S: Final = 600.0  # one request, send to answer
PROBE_TIMEOUT_S: Final = 10.0
MAX_CONFIG_BYTES: Final = 1 << 20  # a model's config.json read for its vocab_size
MAX_REPLY_BYTES: Final = 64 << 20

COMPLETED, ABORTED, FAILED = "completed", "aborted", "failed"
ProgressCallback = Callable[[int, int], None]  # (requests settled, total)


def tokens_for(hash_id: int, length: int, vocab: int) -> list[int]:
    """``length`` token ids in [LOWEST_TOKEN, vocab) from one hash id, the same on every call."""
    span = vocab - LOWEST_TOKEN
    out: list[int] = []
    counter = 0
    while len(out) < length:
        digest = hashlib.blake2b(hash_id.to_bytes(8, "little") + counter.to_bytes(4, "little"),
                                 digest_size=64, key=TOKEN_KEY).digest()
        out += [LOWEST_TOKEN + int.from_bytes(digest[i:i + 4], "little") % span for i in range(0, 64, 4)]
        counter += 1
    return out[:length]


def input_ids(request: WorkloadRequest, block: int, vocab: int) -> list[int]:
    """The request's prompt: block k is ``tokens_for(hash_ids[k])``, the last block cut to the length."""
    out: list[int] = []
    for k, hash_id in enumerate(request.hash_ids):
        out += tokens_for(hash_id, min(block, request.input_len - k * block), vocab)
    return out[: request.input_len]


@dataclass(frozen=True)
class Planned:
    """One request as it will be sent."""

    rid: str
    send_at_s: float  # after the run's start
    request: WorkloadRequest
    max_new_tokens: int
    abort_after_s: float | None  # drop the connection this long after the send

    def body(self, block: int, vocab: int) -> bytes:
        params = {"max_new_tokens": self.max_new_tokens, "ignore_eos": True}
        body: dict[str, Any] = {"rid": self.rid, "input_ids": input_ids(self.request, block, vocab),
                                "sampling_params": params}
        if self.request.priority is not None:
            body["priority"] = self.request.priority
        return json.dumps(body).encode()


def plan(workload: Workload, *, speedup: float = 1.0, limit: int | None = None,
         rid_prefix: str = "redrive-") -> list[Planned]:
    """The first ``limit`` requests, at their recorded times divided by ``speedup``; each recorded
    client abort ``ABORT_LEAD_S`` before its time (scaled) after the send."""
    if speedup <= 0:
        raise UsageError(f"--speedup must be > 0, got {speedup}")
    chosen = workload.requests[:limit] if limit is not None else workload.requests
    width = len(str(max(len(chosen) - 1, 0)))
    return [
        Planned(rid=f"{rid_prefix}{n:0{width}d}", send_at_s=r.t_ms / 1000 / speedup, request=r,
                max_new_tokens=r.redrive_max_new_tokens,
                abort_after_s=None if r.client_abort_ms is None
                else max(r.client_abort_ms / 1000 / speedup - ABORT_LEAD_S, 0.0))
        for n, r in enumerate(chosen)
    ]


@dataclass
class Outcome:
    rid: str
    status: str  # COMPLETED | ABORTED | FAILED
    detail: str = ""
    late_s: float = 0.0  # sent this long after its planned time
    output_tokens: int | None = None


@dataclass
class RedriveResult:
    url: str
    outcomes: list[Outcome] = field(default_factory=list)
    unreachable: str | None = None  # why the server stopped answering, if it did

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status)

    @property
    def failed(self) -> int:
        return self.count(FAILED)

    def summary(self) -> str:
        late = sorted(o.late_s for o in self.outcomes)
        when = f"; sends late by at most {late[-1] * 1000:.0f} ms (median {late[len(late) // 2] * 1000:.0f} ms)" if late else ""
        return (f"{self.count(COMPLETED)} completed, {self.failed} failed, {self.count(ABORTED)} aborted "
                f"of {len(self.outcomes)}{when}")


def _split_url(url: str) -> tuple[str, int, str]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise UsageError(f"--url {url!r}: expected http://HOST:PORT")
    return parts.hostname, parts.port or 80, parts.path.rstrip("/")


def _get_json(url: str, path: str) -> Any:
    host, port, base = _split_url(url)
    conn = http.client.HTTPConnection(host, port, timeout=PROBE_TIMEOUT_S)
    try:
        conn.request("GET", base + path)
        reply = conn.getresponse()
        data = reply.read(MAX_CONFIG_BYTES)
        if reply.status != 200:
            raise EndpointUnreachableError(f"{url}: GET {path} answered {reply.status}; is it an sglang server?")
        return json.loads(data)
    except (OSError, http.client.HTTPException) as exc:
        raise EndpointUnreachableError(f"{url}: {_why(exc)}; is an sglang server listening there?") from None
    except ValueError:
        raise EndpointUnreachableError(f"{url}: GET {path} is not JSON; is it an sglang server?") from None
    finally:
        conn.close()


def server_vocab(url: str, vocab: int | None = None) -> int:
    """The server's vocabulary size: ``vocab`` if given, else its model folder's config.json.

    Also the liveness probe: a server that does not answer ``/model_info`` raises
    ``EndpointUnreachableError`` naming the URL."""
    info = _get_json(url, "/model_info")
    if vocab is not None:
        if vocab <= LOWEST_TOKEN:
            raise UsageError(f"--vocab must be more than {LOWEST_TOKEN}, got {vocab}")
        return vocab
    model_path = str(info.get("model_path") or "") if isinstance(info, dict) else ""
    config = Path(model_path) / "config.json"
    try:
        if config.is_file() and config.stat().st_size <= MAX_CONFIG_BYTES:
            size = json.loads(config.read_text(encoding="utf-8")).get("vocab_size")
            if isinstance(size, int) and size > LOWEST_TOKEN:
                return size
    except (OSError, ValueError):
        pass
    raise UsageError(f"{url} serves {model_path or 'a model'} whose vocabulary size is not readable here; "
                     "give it with --vocab N")


REFUSED, RESET = "connection refused", "connection lost"
_CONNECTION_LOST: Final = frozenset({REFUSED, RESET})


def _why(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return REFUSED
    if isinstance(exc, (ConnectionError, http.client.RemoteDisconnected, http.client.IncompleteRead)):
        return RESET
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return "no answer (timed out)"
    return str(exc) or type(exc).__name__


def _send(host: str, port: int, base: str, planned: Planned, body: bytes) -> Outcome:
    """POST one request; a planned abort closes the connection at its time."""
    conn = http.client.HTTPConnection(host, port, timeout=REQUEST_TIMEOUT_S)
    try:
        conn.request("POST", base + "/generate", body=body, headers={"Content-Type": "application/json"})
        if planned.abort_after_s is not None and conn.sock is not None:
            conn.sock.settimeout(max(planned.abort_after_s, 0.001))  # /generate writes nothing until done
        reply = conn.getresponse()
        data = reply.read(MAX_REPLY_BYTES)
    except (TimeoutError, socket.timeout):
        if planned.abort_after_s is not None:
            return Outcome(planned.rid, ABORTED, "dropped by the client, as recorded")
        return Outcome(planned.rid, FAILED, f"no answer in {REQUEST_TIMEOUT_S:.0f}s")
    except (OSError, http.client.HTTPException) as exc:
        return Outcome(planned.rid, FAILED, _why(exc))
    finally:
        conn.close()
    return _judge(planned, reply.status, data)


def _judge(planned: Planned, status: int, data: bytes) -> Outcome:
    """An answer: completed, or refused by the server (an abort only where the recording had one)."""
    try:
        meta = json.loads(data).get("meta_info", {})
        reason = (meta.get("finish_reason") or {}).get("type")
        tokens = meta.get("completion_tokens")
    except (ValueError, AttributeError):
        meta, reason, tokens = {}, None, None
    if status == 200 and reason != "abort":
        return Outcome(planned.rid, COMPLETED, output_tokens=tokens if isinstance(tokens, int) else None)
    detail = f"the server answered {status}" + (" (abort)" if reason == "abort" else "")
    recorded_abort = planned.request.finish_reason in REFUSED_FINISH or planned.request.client_aborted
    return Outcome(planned.rid, ABORTED if recorded_abort else FAILED, detail)


def redrive(url: str, planned: list[Planned], block: int, vocab: int,
            on_progress: ProgressCallback | None = None) -> RedriveResult:
    """Send every planned request at its time; return once each has an outcome.

    Refused connections mean the server is gone: the requests not yet sent fail at once,
    and ``RedriveResult.unreachable`` says so."""
    host, port, base = _split_url(url)
    result = RedriveResult(url)
    outcomes: dict[str, Outcome] = {}
    lock = threading.Lock()
    slots = threading.BoundedSemaphore(MAX_IN_FLIGHT)
    dead = threading.Event()
    total = len(planned)

    def settle(outcome: Outcome) -> None:
        with lock:
            outcomes[outcome.rid] = outcome
            done = len(outcomes)
        if on_progress is not None:
            on_progress(done, total)

    def one(p: Planned, body: bytes, late_s: float) -> None:
        try:
            outcome = _send(host, port, base, p, body)
            outcome.late_s = late_s
            if outcome.status == FAILED and outcome.detail == REFUSED:
                if not dead.is_set():
                    result.unreachable = f"connection refused from request {p.rid} on"
                dead.set()
            settle(outcome)
        finally:
            slots.release()

    threads: list[threading.Thread] = []
    start = time.monotonic()
    for p in sorted(planned, key=lambda p: p.send_at_s):
        if dead.is_set():
            settle(Outcome(p.rid, FAILED, "not sent: the server had stopped answering"))
            continue
        body = p.body(block, vocab)  # made before the wait, so the send is on time
        delay = p.send_at_s - (time.monotonic() - start)
        if delay > 0 and dead.wait(delay):
            settle(Outcome(p.rid, FAILED, "not sent: the server had stopped answering"))
            continue
        slots.acquire()
        thread = threading.Thread(target=one, args=(p, body, max(time.monotonic() - start - p.send_at_s, 0.0)),
                                  name=f"redrive-{p.rid}", daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    result.outcomes = [outcomes[p.rid] for p in planned]
    if result.unreachable is None and any(o.detail in _CONNECTION_LOST for o in result.outcomes):
        try:  # requests lost their connection: is the server still there?
            _get_json(url, "/model_info")
        except EndpointUnreachableError as exc:
            result.unreachable = str(exc).removeprefix(f"{url}: ").split(";")[0] + " after the run"
    return result


def check_reachable(result: RedriveResult) -> None:
    """Raise the one-line error of a run whose server stopped answering."""
    if result.unreachable is not None:
        raise EndpointUnreachableError(f"{result.url}: the server stopped answering ({result.unreachable}); "
                                       f"{result.summary()}")
