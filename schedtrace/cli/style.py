"""How the commands print: counted words and tables that fit an 80-column terminal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

_ES_ENDINGS = ("s", "sh", "ch", "x")


def plural(count: int, word: str) -> str:
    """``1 stall``, ``2 stalls``, ``0 passes``: the count and the word in the right number."""
    if count == 1:
        return f"{count} {word}"
    return f"{count} {word}{'es' if word.endswith(_ES_ENDINGS) else 's'}"


def compact_table(headers: Sequence[str], *, title: str | None = None, shrink: Sequence[str] = ()) -> Table:
    """A borderless table; only the ``shrink`` columns give way (ellipsis) when it is too wide.

    The other columns never wrap, so a row stays on one line at 80 columns
    and a long id is cut, not spread over three lines.
    """
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0),
                  pad_edge=False, show_edge=False, title_style="bold")
    for header in headers:
        flexible = header in shrink
        table.add_column(header, no_wrap=not flexible, overflow="ellipsis")
    return table


def summary_console() -> Console:
    """The console a command prints its summary on (stdout).

    rich exits 1 when the reader of a pipe leaves (``schedtrace info T | head``);
    here that is a BrokenPipeError, which schedtrace.cli.run counts as success.
    """
    from rich.console import Console

    class SummaryConsole(Console):
        def on_broken_pipe(self) -> None:
            try:
                super().on_broken_pipe()  # points stdout at /dev/null: nothing fails at exit
            except SystemExit:
                raise BrokenPipeError from None

    return SummaryConsole()
