"""The browser's replay, in a child process it can end at once.

``replay_trace`` imports sglang and runs for as long as the trace is long; in
a thread of the browser, quitting had to wait for it (a thread cannot be
stopped), and sglang's import left the browser's exit slow even after. So
the browser runs this module as a child in its own process group and kills
the group when it quits; any worker processes the replay starts go with it.

    python -m schedtrace.tui.replay_child OLD NEW PART...

(the parts of one rank, read as one trace)

writes frames to stdout: a 4-byte big-endian length, then a msgpack
``[kind, payload]``. Kinds: ``progress`` ([done, total]), ``divergence`` (a
``Divergence``), ``done`` (the ``Report``), ``failed`` (one line).
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Iterator
from typing import BinaryIO

import msgspec

from schedtrace.tracer.contract.errors import SchedtraceError
from schedtrace.tracer.contract.report import Divergence, Report

_LENGTH = struct.Struct(">I")
_encoder = msgspec.msgpack.Encoder()
_frame = msgspec.msgpack.Decoder(tuple[str, msgspec.Raw])
_divergence = msgspec.msgpack.Decoder(Divergence)
_report = msgspec.msgpack.Decoder(Report)


def write_frame(out: BinaryIO, kind: str, payload: object) -> None:
    data = _encoder.encode((kind, msgspec.Raw(_encoder.encode(payload))))
    out.write(_LENGTH.pack(len(data)) + data)
    out.flush()


def read_frames(stream: BinaryIO) -> Iterator[tuple[str, object]]:
    """(kind, decoded payload) until the child's stdout closes."""
    while True:
        head = stream.read(_LENGTH.size)
        if len(head) < _LENGTH.size:
            return
        (length,) = _LENGTH.unpack(head)
        data = stream.read(length)
        if len(data) < length:
            return
        kind, raw = _frame.decode(data)
        if kind == "divergence":
            yield kind, _divergence.decode(raw)
        elif kind == "done":
            yield kind, _report.decode(raw)
        else:
            yield kind, msgspec.msgpack.decode(raw)


def main(argv: list[str]) -> int:
    old, new, *paths = argv
    # The frames own the real stdout; anything else printed (sglang logs) goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    try:
        from schedtrace.replay.engine import reopened, replay_trace  # imports sglang

        with reopened(tuple(paths)) as source:
            report = replay_trace(
                source, old, new,
                on_progress=lambda done, total: write_frame(out, "progress", (done, total)),
                on_divergence=lambda d: write_frame(out, "divergence", d),
            )
    except ImportError as exc:
        write_frame(out, "failed", f"replay engine not available: {exc}")
        return 1
    except SchedtraceError as exc:
        write_frame(out, "failed", str(exc))
        return 1
    except Exception as exc:  # a replay bug is reported in one line, as the browser shows it
        write_frame(out, "failed", f"{type(exc).__name__}: {exc}")
        return 1
    write_frame(out, "done", report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
