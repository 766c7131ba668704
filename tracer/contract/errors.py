"""Every error schedtrace raises on purpose.

The CLI turns any ``SchedtraceError`` into one clear line on stderr and exit
code 2; anything else is a bug and keeps its traceback.

    SchedtraceError
    ├── TraceError                      a trace file cannot be used
    │   ├── TraceNotFoundError          missing or unreadable path
    │   ├── TraceFormatError            corrupt or hostile bytes (has .offset)
    │   │   └── TraceDamagedError       reading reached an unreadable region (has .gap)
    │   ├── TraceSetError               files that do not make one trace set (missing part, mixed runs)
    │   ├── TraceVersionError           schema (or replay report) newer than this reader
    │   └── ReportMismatchError         a replay report does not fit the trace it is shown with
    ├── ReplayError                     replay cannot go on
    │   ├── FixMismatchError            a fix's target code is not what we patch
    │   ├── ReplayStateError            a record cannot be turned into sglang state
    │   └── ReproError                  no verified test for a divergence or stall (repro)
    ├── SandboxError                    the embedded CPU server failed
    │   └── ServerStartError            it did not become healthy
    ├── ExportError                     an exporter could not deliver
    │   └── EndpointUnreachableError    retried within its bound, then gave up
    ├── UsageError                      bad options that click itself cannot see
    │   └── ArmPatchError               a user arm (diff or edits module) does not apply to the installed sglang
    └── TraceWriteError                 also an OSError: a write did not reach the file
                                        (for the recorder's writer thread, not the user)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schedtrace.tracer.contract.framing import Gap


class SchedtraceError(Exception):
    """Base of every error meant for the user, not for a traceback.

    Picklable with its message and attributes whatever its ``__init__`` takes:
    an error raised in a worker process (``--jobs``, Ray) reaches the parent whole.
    """

    def __reduce__(self) -> tuple:
        return _rebuilt, (type(self), str(self), dict(self.__dict__))


def _rebuilt(cls: type[SchedtraceError], message: str, state: dict) -> SchedtraceError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


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


class TraceDamagedError(TraceFormatError):
    """A read reached bytes the reader could not check or parse; ``gap`` says which."""

    def __init__(self, path: str, gap: Gap) -> None:
        self.gap = gap
        offset = gap.start if gap.first_bad is None else gap.first_bad
        super().__init__(path, offset, f"{gap.reason}; {gap.describe()}")


class TraceVersionError(TraceError):
    pass


class ReportMismatchError(TraceError):
    """A replay report names passes, or a trace fingerprint, that the trace does not have."""


class TraceWriteError(SchedtraceError, OSError):
    """``TraceWriter`` could not put a batch on disk (disk full, I/O error).

    An ``OSError`` too, with the cause's ``errno``, so a caller that catches
    ``OSError`` still sees it. ``records_written`` of the call's records reached
    the file (whole sealed batches), ``records_lost`` did not; the file reads
    back as it was before the lost bytes.
    """

    def __init__(self, path: str, offset: int, cause: OSError, records_written: int, records_lost: int) -> None:
        self.path = str(path)
        self.offset = offset
        self.records_written = records_written
        self.records_lost = records_lost
        reason = cause.strerror or str(cause) or type(cause).__name__
        OSError.__init__(self, cause.errno, f"{self.path}: cannot write at offset {offset}: {reason}; "
                                            f"{records_lost} records not written")


class TraceSetError(TraceError):
    """The files given do not form the trace set asked for (a part missing, several runs or ranks)."""


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


class ReproError(ReplayError):
    """``schedtrace repro`` could not produce a test that fails on stock and passes with the fix."""


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


class ArmPatchError(UsageError):
    """A user arm that does not apply: ``arm`` (its file), ``where`` (the sglang file and hunk or edit)."""

    def __init__(self, arm: str, where: str, detail: str) -> None:
        self.arm, self.where, self.detail = arm, where, detail
        super().__init__(f"{arm}: {where}: {detail}" if where else f"{arm}: {detail}")
