"""Shared pieces of the OpenTelemetry and export tests: a small hand-built trace
with known values, and a real OTLP/HTTP receiver on loopback."""

from __future__ import annotations

import gzip
import subprocess
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from schedtrace.testing import builders
from schedtrace.tracer.contract.format import write_trace
from schedtrace.tracer.contract.schema import (
    Admitted,
    Aiter,
    Alloc,
    Arrival,
    Candidate,
    ChunkedReq,
    ChunkOutcome,
    Finish,
    Header,
    HookError,
    Idle,
    KvSnapshot,
    Loss,
    Pass,
    RunningReq,
    WaitingReq,
)

REPO = Path(__file__).resolve().parents[1]
START_WALL_NS = 1_700_000_000_000_000_000


def header() -> Header:
    return builders.header(
        pid=4242, dp_rank=1, start_wall_ns=START_WALL_NS, max_req_slots=12,
        server_args=builders.server_args(
            chunked_prefill_size=512, max_running_requests=8, max_total_tokens=6000, model_path="tiny",
        ),
    )


def _waiting(rid: str, input_len: int) -> WaitingReq:
    return WaitingReq(rid=rid, input_len=input_len, output_len=0, max_new_tokens=16, prefix_len=0)


def _pass(seq: int, t_ns: int, dur_ns: int, **kw) -> Pass:
    fields = dict(kv=KvSnapshot(available=5000, evictable=100), req_slots_free=10, new_token_ratio=0.5,
                  chunked_prefill_size=512)
    fields.update(kw)
    return builders.pass_record(seq, t_ns=t_ns, dur_ns=dur_ns, **fields)


def records() -> list:
    """Four passes (admitted, rejected x5, error, chunk) and their events, in file order."""
    r1, r2 = _waiting("r1", 100), _waiting("r2", 1200)
    return [
        Arrival(t_ns=500, rid="r1", input_len=100, max_new_tokens=16),
        Arrival(t_ns=600, rid="r2", input_len=1200, max_new_tokens=16),
        _pass(0, 1000, 200, waiting=[r1, r2],
              candidates=[Candidate("r1", 0, 100, "CONTINUE"), Candidate("r2", 0, 0, "NO_TOKEN")],
              admitted=[Admitted("r1", 0, 100)]),
        Alloc(t_ns=1300, pass_seq=0, op="alloc_extend", requested=100, available=5000, evictable=100, ok=True),
        Alloc(t_ns=1400, pass_seq=0, op="alloc_extend", requested=9000, available=5000, evictable=100, ok=False),
        Aiter(t_ns=1450, forward_mode="EXTEND", seq_lens_sum=100, max_chunk_capacity=4096,
              in_piecewise_graph=False, in_breakable_graph=True, method="chunked", pass_seq=0),
        _pass(1, 2000, 100, repeat=5, waiting=[r2], running=[RunningReq("r1", 100, 1, 16)],
              batch_is_full_in=True, batch_is_full_out=True, kv=KvSnapshot(available=4000, evictable=100)),
        HookError(t_ns=2200, hook="PrefillAdder.add_one_req", message="KeyError: 'x'"),
        Idle(t_ns=2500, count=10),
        _pass(2, 3000, 50, idle_before=10, waiting=[r2], chunked=ChunkedReq("r2", 1200, 512, 16),
              error="AssertionError: two chunked requests"),
        Loss(t_ns=3100, count=3),
        _pass(3, 4000, 80, waiting=[], running=[RunningReq("r1", 100, 4, 16)], chunked=ChunkedReq("r2", 1200, 512, 16),
              chunk=ChunkOutcome("r2", 512, 512), kv=KvSnapshot(available=3000, evictable=50)),
        Finish(t_ns=4500, rid="r1", output_len=16, reason="length"),
        Alloc(t_ns=4600, pass_seq=1, op="alloc", requested=64, available=10, evictable=0, ok=False),
    ]


def write_small_trace(path: Path) -> Path:
    return write_trace(path, header(), records(), end_t_ns=5000)


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``schedtrace ARGS`` in a fresh process (exit codes and stderr exactly as a user sees them)."""
    return subprocess.run(
        [sys.executable, "-c", "from schedtrace.cli import main; main()", *args],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )


class OtlpReceiver:
    """A minimal OTLP/HTTP trace receiver on 127.0.0.1 that decodes every request.

    ``status``: what it answers (200 accepts; 503 makes the exporter retry).
    """

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.requests: list[ExportTraceServiceRequest] = []
        self.attempts = 0
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                receiver.attempts += 1
                receiver.paths.append(self.path)
                if receiver.status != 200:
                    self.send_response(receiver.status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.requests.append(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def spans(self) -> list:
        """(resource attributes dict, span) for every span received."""
        out = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                resource = {kv.key: _any_value(kv.value) for kv in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        out.append((resource, span))
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def _any_value(value):
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def attrs_of(proto_span_or_event) -> dict:
    return {kv.key: _any_value(kv.value) for kv in proto_span_or_event.attributes}


def closed_port() -> int:
    """A loopback port with nothing listening (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
