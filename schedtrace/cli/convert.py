"""``schedtrace convert SOURCE DEST``: rewrite a trace as format v2 (keyframes and deltas), or back to v1.

The conversion is ``schedtrace.tracer.contract.convert`` (every record read
whole and written again); this module checks the paths and prints one line.
DEST must not exist: convert never overwrites a file.
"""

from __future__ import annotations

from pathlib import Path

import click

from schedtrace.cli.options import TRACE
from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.schema import SCHEMA_VERSION


@click.command()
@click.argument("source", type=TRACE)
@click.argument("dest", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--to-version", "version", type=click.IntRange(1, SCHEMA_VERSION), default=SCHEMA_VERSION,
              show_default=True, help="Format to write: 2 (keyframes and deltas) or 1 (every pass whole).")
def convert(source: Path, dest: Path, version: int) -> None:
    """Rewrite the trace SOURCE as DEST in another format version (default: v2)."""
    from schedtrace.tracer.contract.convert import convert_trace

    if dest.exists() or dest.is_symlink():
        raise UsageError(f"{dest}: already exists (convert never overwrites a file)")
    done = convert_trace(source, dest, version=version)
    click.echo(f"{source} (v{done.source_version}, {done.source_bytes:,} bytes) -> {dest} "
               f"(v{done.version}, {done.dest_bytes:,} bytes, {size_change(done.source_bytes, done.dest_bytes)}): "
               f"{done.passes:,} passes, {done.keyframes:,} written whole")


def size_change(before: int, after: int) -> str:
    """``9.1x smaller``, ``3.6x larger`` or ``the same size``: the new size against the old."""
    if after == before:
        return "the same size"
    if after < before:
        return f"{before / max(after, 1):.1f}x smaller"
    return f"{after / max(before, 1):.1f}x larger"
