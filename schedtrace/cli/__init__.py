"""The ``schedtrace`` console script.

Each subcommand lives in the module that owns its feature and is imported
only when used, so ``schedtrace info`` never pays for importing sglang.
"""

from __future__ import annotations

import importlib
import sys

import click

from schedtrace.tracer.contract.errors import SchedtraceError

# name -> "module:attribute" of a click.Command
COMMANDS: dict[str, str] = {
    "sandbox": "schedtrace.cli.sandbox:sandbox",
    "demo": "schedtrace.cli.demo:demo",
    "info": "schedtrace.cli.info:info",
    "replay": "schedtrace.cli.replay:replay",
    "bisect": "schedtrace.cli.bisect:bisect",
    "tui": "schedtrace.cli.tui:tui",
    "export": "schedtrace.cli.export:export",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=LazyGroup)
@click.version_option(package_name="schedtrace")
def cli() -> None:
    """Record, replay and browse SGLang scheduler traces."""


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="schedtrace", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except SchedtraceError as exc:
        click.echo(f"schedtrace: error: {exc}", err=True)
        sys.exit(2)
    except BrokenPipeError:
        sys.exit(0)
