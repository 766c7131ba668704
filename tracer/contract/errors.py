"""Every error schedtrace raises on purpose.

The CLI turns any ``SchedtraceError`` into one clear line on stderr and exit
code 2; anything else is a bug and keeps its traceback.

    SchedtraceError
    ├── TraceError                      a trace file cannot be used
    │   ├── TraceNotFoundError          missing or unreadable path
    │   ├── TraceFormatError            corrupt or hostile bytes (has .offset)
    │   └── TraceVersionError           schema newer than this reader
    ├── ReplayError                     replay cannot go on
    │   ├── FixMismatchError            a fix's target code is not what we patch
    │   └── ReplayStateError            a record cannot be turned into sglang state
    ├── SandboxError                    the embedded CPU server failed
    │   └── ServerStartError            it did not become healthy
    ├── ExportError                     an exporter could not deliver
    │   └── EndpointUnreachableError    retried within its bound, then gave up
    └── UsageError                      bad options that click itself cannot see
"""

from __future__ import annotations


class SchedtraceError(Exception):
    """Base of every error meant for the user, not for a traceback."""


class TraceError(SchedtraceError):
    def __init__(self, path: str, message: str) -> None:
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")


class TraceNotFoundError(TraceError):
    pass


class TraceFormatError(TraceError):
    """Bytes at ``offset`` are not what the schema expects."""

    def __init__(self, path: str, offset: int, message: str, record: int | None = None) -> None:
        self.offset = offset
        self.record = record
        where = f"offset {offset}" if record is None else f"record {record} at offset {offset}"
        super().__init__(path, f"{where}: {message}")


class TraceVersionError(TraceError):
    pass


class ReplayError(SchedtraceError):
    pass


class FixMismatchError(ReplayError):
    def __init__(self, fix: str, function: str, sglang_version: str, detail: str) -> None:
        self.fix, self.function, self.sglang_version = fix, function, sglang_version
        super().__init__(
            f"fix {fix!r} cannot apply to {function} in sglang {sglang_version}: {detail}"
        )


class ReplayStateError(ReplayError):
    pass


class SandboxError(SchedtraceError):
    pass


class ServerStartError(SandboxError):
    pass


class ExportError(SchedtraceError):
    pass


class EndpointUnreachableError(ExportError):
    pass


class UsageError(SchedtraceError):
    pass
