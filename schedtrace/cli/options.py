"""Options and arguments more than one command takes, each declared once.

Everything here is checked while click parses, before a command imports
sglang: a missing trace or a misspelt arm fails in a fraction of a second,
not after the 12 s sglang import.

``--json PATH`` means one thing in every command: write the command's JSON
to PATH; ``-`` writes it to stdout in place of the human summary.

``--ray`` and ``--address`` run a command's work as Ray tasks (``executor_for``).

``TRACE...`` is a trace set: files, globs or directories, grouped into runs,
ranks and parts (``schedtrace.tracer.contract.traceset``). A command reads
every rank of the run, or the one ``--rank`` names; its JSON is then one
report per rank, ``{"run": ID, "ranks": {"tp0": ..., ...}}``, and the
one-rank JSON stays as it was.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TypeVar

import click
import msgspec
from click.core import ParameterSource

from schedtrace.tracer.analysis.stalls import STALL_RULE
from schedtrace.tracer.contract.errors import SchedtraceError, UsageError
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES, FIXED, RAY_ADDRESS_ENV, STOCK
from schedtrace.tracer.contract.traceset import RankTrace, Run, TraceSet, open_traceset

F = TypeVar("F", bound=Callable[..., Any])
STDOUT = "-"
# Two workers beat one on long traces even on 2 shared cores (bench/bench_replay.py);
# the engine uses one process below 2 * MIN_PASSES_PER_JOB pass records anyway.
DEFAULT_JOBS = min(2, os.cpu_count() or 1)
_ALIAS_KEY = "schedtrace.stall_passes_alias"


class TraceFile(click.ParamType):
    """A trace path, opened once to check it: missing, a directory, empty or
    not a trace is the reader's own one-line error, raised now."""

    name = "trace"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        path = Path(value)
        TraceReader(path).close()  # raises a TraceError naming the file and offset
        return path


class Variant(click.ParamType):
    """An arm: ``stock``, ``fixed``, a fix name, a user arm file (a .diff/.patch of sglang's python/
    tree, or an edits .py) or a comma list of them; converted to its canonical spelling, each file
    named by its label ``FILE@HASH`` (the name reports carry)."""

    name = "arm"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        # variants reads names and checks arm files against sglang's source text; it imports no
        # sglang (tests/test_cli.py checks). A file that does not apply is one line, exit 2.
        from schedtrace.arms.variants import canonical_variant
        from schedtrace.tracer.contract.errors import ArmPatchError

        try:
            return canonical_variant(value)
        except ArmPatchError:
            raise
        except UsageError as exc:
            self.fail(str(exc), param, ctx)


TRACE = TraceFile()
VARIANT = Variant()


def trace_argument(f: F) -> F:
    """One trace file (``repro``); the other commands take a trace set (``traces_argument``)."""
    return click.argument("trace", type=TRACE)(f)


def _trace_opener(skip_damaged: bool) -> Callable[[click.Context, click.Parameter, tuple[str, ...]], TraceSet]:
    def open_traces(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> TraceSet:
        # Headers and footers only: a missing part or a bad file fails here, before sglang is imported.
        return open_traceset(value, skip_damaged=skip_damaged)

    return open_traces


def _traces(f: F, rank_help: str, *, skip_damaged: bool) -> F:
    f = click.option("--run", "run_id", metavar="ID",
                     help="The run to read, by its id or a prefix, when the files hold several.")(f)
    f = click.option("--rank", metavar="RANK", help=f"{rank_help} (tp3, dp1.tp3, or a bare tp rank).")(f)
    return click.argument("traces", nargs=-1, required=True, metavar="TRACE...",
                          callback=_trace_opener(skip_damaged))(f)


def traces_argument(f: F) -> F:
    """``TRACE...``: files, globs or directories, opened as a ``TraceSet`` while click parses;
    an unreadable region stops the command (it has no way to show what was lost)."""
    return _traces(f, "Read only this rank; default: every rank", skip_damaged=False)


def damaged_traces_argument(f: F) -> F:
    """``TRACE...`` read past unreadable regions, for the commands that list them (info, replay, bisect)."""
    return _traces(f, "Read only this rank; default: every rank", skip_damaged=True)


def one_rank_traces_argument(f: F) -> F:
    """``TRACE...`` for the browser (``tui``), read past unreadable regions, which it marks."""
    return _traces(f, "The rank to start on; default: the first", skip_damaged=True)


def chosen_ranks(traces: TraceSet, rank: str | None, run_id: str | None, *,
                 first_only: bool = False) -> tuple[Run, tuple[RankTrace, ...]]:
    """The run and the ranks a command works on: ``--rank``'s, else every rank (or the first).

    The run's notes (ranks or leading parts not in the set) go to stderr, one line each.
    """
    run = traces.run(run_id)
    for note in run.notes:
        click.echo(f"schedtrace: note: {note}", err=True)
    if rank is not None:
        return run, (run.rank(rank),)
    return run, run.ranks[:1] if first_only else run.ranks


_sorted_json = msgspec.json.Encoder(order="sorted")


def ranks_json(run: Run, reports: dict[str, Any]) -> bytes:
    """Several ranks' reports as one deterministic JSON document (keys sorted, indented)."""
    return msgspec.json.format(_sorted_json.encode({"run": run.label, "ranks": reports}), indent=2) + b"\n"


def old_new_options(old: str | None = STOCK, new: str | None = FIXED, why: str = "") -> Callable[[F], F]:
    """``--old`` (the baseline arm) and ``--new`` (the arm compared with it)."""
    def decorate(f: F) -> F:
        f = click.option("--new", type=VARIANT, default=new, show_default=new is not None,
                         help=f"The arm compared with the baseline{why}.")(f)
        return click.option("--old", type=VARIANT, default=old, show_default=old is not None,
                            help=f"The baseline arm{why}: stock, fixed, a fix, a .diff/.patch or edits .py file, "
                            "or a comma list.")(f)
    return decorate


def _stall_passes_alias(ctx: click.Context, param: click.Parameter, value: int | None) -> None:
    if value is not None:
        click.echo(f"schedtrace: warning: {param.opts[0]} is deprecated; use --stall-passes", err=True)
        ctx.meta[_ALIAS_KEY] = value


def _stall_passes(ctx: click.Context, param: click.Parameter, value: int) -> int:
    alias = ctx.meta.get(_ALIAS_KEY)
    if alias is None:
        return value
    if ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE:
        raise click.BadParameter("give it once, not also under its deprecated name", ctx, param)
    return alias


def stall_passes_option(*deprecated: str) -> Callable[[F], F]:
    """``--stall-passes N`` with the one default; ``deprecated`` names stay accepted, hidden."""
    def decorate(f: F) -> F:
        f = click.option("--stall-passes", type=click.IntRange(min=1), default=DEFAULT_STALL_PASSES,
                         metavar="N", show_default=True, callback=_stall_passes,
                         help=f"A stall: this many consecutive passes (repeats counted) where {STALL_RULE}.")(f)
        for name in deprecated:
            # Eager, so it is seen before --stall-passes whatever the order on the command line.
            f = click.option(name, type=click.IntRange(min=1), default=None, hidden=True, is_eager=True,
                             expose_value=False, callback=_stall_passes_alias)(f)
        return f
    return decorate


def from_pass_option(f: F) -> F:
    return click.option("--from", "from_pass", type=click.IntRange(min=0), default=0, metavar="PASS", show_default=True,
                        help="Closed loop: start from this recorded pass.")(f)


def jobs_option(f: F) -> F:
    return click.option("--jobs", type=click.IntRange(min=1), default=DEFAULT_JOBS, metavar="N", show_default=True,
                        help="Worker processes for long traces (used from 4000 pass records up).")(f)


def _json_target(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None or value == STDOUT:
        return value
    if Path(value).is_dir():
        raise click.BadParameter(f"{value} is a directory, expected a file", ctx, param)
    folder = Path(value).parent  # checked now: a replay would find it out only after importing sglang
    if not folder.is_dir():
        raise click.BadParameter(f"{value}: no such directory {folder}", ctx, param)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{value}: cannot write into {folder}", ctx, param)
    try:
        TraceReader(value).close()
    except SchedtraceError:
        return value  # not a trace (or not there yet): safe to write
    # `info --json a.trace b.trace` (the old flag form) must not overwrite a.trace.
    raise click.BadParameter(f"{value} is a trace file; refusing to overwrite it", ctx, param)


def json_option(what: str) -> Callable[[F], F]:
    return click.option("--json", "json_out", metavar="PATH", callback=_json_target,
                        help=f"Write {what} as JSON to PATH ('-': stdout, instead of the summary).")


@contextmanager
def atomic_output(target: str) -> Iterator[IO[bytes]]:
    """A binary file that becomes ``target`` only when complete ('-': stdout)."""
    if target == STDOUT:
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    path = Path(target)
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "wb") as out:
            yield out
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise UsageError(f"{path}: cannot write: {exc.strerror}") from None
    except BaseException:
        partial.unlink(missing_ok=True)  # never leave half a JSON file behind
        raise
    os.replace(partial, path)


def write_json(target: str, data: bytes) -> None:
    with atomic_output(target) as out:
        out.write(data)


def _ray_flag(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    from schedtrace.replay.scale.ray_executor import INSTALL_HINT, ray_missing  # imports no ray

    if value and ray_missing():
        raise UsageError(INSTALL_HINT)  # now, before sglang is imported
    return value


def ray_options(f: F) -> F:
    """``--ray`` (work as Ray tasks) and ``--address ADDR`` (the cluster; default RAY_ADDRESS, else a
    Ray started here with --jobs CPUs)."""
    f = click.option("--address", metavar="ADDR", default=None,
                     help=f"With --ray: the Ray cluster to join (default: ${RAY_ADDRESS_ENV}, "
                     "else Ray starts here with --jobs CPUs).")(f)
    return click.option("--ray", "use_ray", is_flag=True, callback=_ray_flag,
                        help="Run the work as Ray tasks (pip install 'schedtrace[ray]'); same report.")(f)


@contextmanager
def executor_for(use_ray: bool, address: str | None, jobs: int | None, activity: Any) -> Iterator[Any]:
    """The executor a command's options ask for: ``jobs`` local processes (None: 1), or Ray with ``jobs``
    CPUs (None: the machine's) or a cluster's; a Ray started here is shut down after.

    ``activity`` (``progress.Activity``) draws the bar over every Ray task."""
    from schedtrace.replay.scale.executor import LocalExecutor

    if address is not None and not use_ray:
        raise UsageError("--address names a Ray cluster: give --ray too")
    if not use_ray:
        yield LocalExecutor(jobs or 1)
        return
    from schedtrace.replay.scale.ray_executor import RayExecutor

    joining = address or os.environ.get(RAY_ADDRESS_ENV)
    activity.phase(f"joining Ray at {joining}" if joining else "starting Ray")
    with RayExecutor(address, jobs=jobs, on_task=activity.tasks("Ray tasks")) as executor:
        yield executor
