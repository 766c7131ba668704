"""Options ``sandbox`` and ``demo`` share: which model, how many ranks."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.sandbox.models import DEFAULT_MODEL, MODELS


def _list_models(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    for entry in MODELS.values():
        click.echo(entry.describe())
    ctx.exit(0)


def server_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--model``, ``--list-models``, ``--tp``, ``--dp``, ``--pp`` and ``--stand-in-forward``."""
    decorators = [
        click.option("--model", type=click.Choice(sorted(MODELS)), default=DEFAULT_MODEL, show_default=True,
                     help="Sandbox model (see --list-models)."),
        click.option("--list-models", is_flag=True, expose_value=False, is_eager=True, callback=_list_models,
                     help="List the sandbox models, what runs real and what is stood in for, and exit."),
        click.option("--tp", type=click.IntRange(1, 2), default=1, show_default=True,
                     help="Tensor-parallel scheduler ranks (2: gloo all-reduce on CPU, one core each)."),
        click.option("--dp", type=click.IntRange(1, 2), default=1, show_default=True,
                     help="DP-attention ranks (2 turns on --enable-dp-attention; the forward is stood in for)."),
        click.option("--pp", type=click.IntRange(1, 2), default=1, show_default=True,
                     help="Pipeline stages (2 runs sglang's PP loop; --enable-dynamic-chunking needs it)."),
        click.option("--stand-in-forward", is_flag=True,
                     help="Stand in for the model forward too (deterministic tokens, EOS included): faster soaks."),
    ]
    for decorator in reversed(decorators):
        command = decorator(command)
    return command


def usable_trace_dir(path: Path | None) -> Path | None:
    """``path`` made and checked writable before any server starts (a one-line error if not)."""
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{path}: cannot create the trace directory: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{path}: the trace directory is not writable")
    return path
