"""The ``schedtrace`` click group; each command's module is imported only when it runs."""

from __future__ import annotations

import importlib

import click

# name -> "module:attribute" of a click.Command
COMMANDS: dict[str, str] = {
    "sandbox": "schedtrace.cli.sandbox:sandbox",
    "demo": "schedtrace.cli.demo:demo",
    "info": "schedtrace.cli.info:info",
    "replay": "schedtrace.cli.replay:replay",
    "bisect": "schedtrace.cli.bisect:bisect",
    "check": "schedtrace.cli.check:check",
    "tui": "schedtrace.cli.tui:tui",
    "export": "schedtrace.cli.export:export",
    "ranks": "schedtrace.cli.ranks:ranks",
    "repro": "schedtrace.cli.repro:repro",
    "sweep": "schedtrace.cli.sweep:sweep",
    "convert": "schedtrace.cli.convert:convert",
    "redrive": "schedtrace.cli.redrive:redrive",
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
