"""The ``schedtrace`` console script: run one command, print any user error as one line.

Nothing here imports click, rich or sglang at module level: the base install
(the recorder plugin's msgpack and msgspec) must still give a one-line
"install the tools extra" error rather than a traceback. Each subcommand
lives in its own module and is imported only when used
(``schedtrace.cli.group``), so ``schedtrace info`` never pays for sglang.

Exit codes: 0 success, 1 a command's own verdict (``replay --fail-on``,
``bisect`` found a stall), 2 a usage or input error, 130 interrupted.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from importlib import metadata

PROG = "schedtrace"
USAGE_EXIT = 2
INTERRUPTED_EXIT = 130
_EXTRA_REQUIREMENT = re.compile(r"""^([A-Za-z0-9_.-]+)[^;]*;\s*extra\s*==\s*["']([^"']+)["']""")


def error_line(message: str) -> str:
    """The one form every user error takes on stderr."""
    return f"{PROG}: error: {message}"


def _print_error(message: str) -> None:
    print(error_line(message), file=sys.stderr, flush=True)


def extra_providing(module: str) -> str | None:
    """The optional extra of this distribution (pyproject.toml) that installs ``module``."""
    try:
        requirements = metadata.requires(PROG) or []
    except metadata.PackageNotFoundError:
        return None
    for requirement in requirements:
        match = _EXTRA_REQUIREMENT.match(requirement)
        if match is None:
            continue
        dist = match.group(1).lower().replace("-", "_")
        if module in (dist, dist.split("_")[0]):
            return match.group(2)
    return None


def _missing_module(exc: ModuleNotFoundError) -> int:
    """A module an extra provides is not installed: say which extra, exit 2."""
    module = (exc.name or "").partition(".")[0]
    extra = extra_providing(module)
    if extra is None:
        raise exc  # not something an install fixes: a bug, keep the traceback
    _print_error(f"this command needs {module}, which is not installed: pip install '{PROG}[{extra}]'")
    return USAGE_EXIT


def _usage_error(exc) -> int:
    """A click usage error (bad option, extra argument, bad choice) as the one line."""
    import click

    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        print(exc.format_message(), file=sys.stderr)  # `schedtrace` alone: the help, as click shows it
        return USAGE_EXIT
    message = exc.format_message().rstrip(".")
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        message += f"; see '{ctx.command_path} --help'"
    _print_error(message)
    return exc.exit_code if isinstance(exc, click.UsageError) else USAGE_EXIT


def run(argv: Sequence[str] | None = None) -> int:
    """Run ``schedtrace ARGV`` in this process and return its exit status."""
    try:
        import click

        from schedtrace.cli.group import cli
        from schedtrace.tracer.contract.errors import SchedtraceError
    except ModuleNotFoundError as exc:
        return _missing_module(exc)
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        # Without standalone mode click returns ctx.exit(code) and raises the rest.
        returned = cli.main(args=args, prog_name=PROG, standalone_mode=False)
    except click.exceptions.Abort:
        _print_error("interrupted")
        return INTERRUPTED_EXIT
    except click.ClickException as exc:
        return _usage_error(exc)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except SchedtraceError as exc:
        _print_error(str(exc))
        return USAGE_EXIT
    except ModuleNotFoundError as exc:
        return _missing_module(exc)
    except BrokenPipeError:
        # `schedtrace info ... | head`: the reader left, nothing is wrong. Point
        # stdout at /dev/null so the flush at exit does not fail either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return returned if isinstance(returned, int) else 0


def main(argv: Sequence[str] | None = None) -> None:
    """The console script: returns on success, ``sys.exit(status)`` otherwise."""
    status = run(argv)
    if status:
        sys.exit(status)
