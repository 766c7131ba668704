"""The browser's prompted actions: ``g`` (go to a pass), ``/`` (find a request), ``f`` (filter).

A mixin of ``TraceApp`` (app.py): each asks one line in a ``Prompt`` and acts
on the answer through the app's own methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schedtrace.tracer.analysis.outcome import OUTCOMES
from schedtrace.tui.messages import FilterReady
from schedtrace.tui.model.filters import SYNTAX, PassFilter
from schedtrace.tui.model.rids import short_rid
from schedtrace.tui.widgets.screens import Prompt

if TYPE_CHECKING:
    from schedtrace.tui.app import TraceApp

SHOWN_MATCHES = 4  # an ambiguous prefix lists this many of its rids


class PromptActions:
    def action_goto(self: TraceApp) -> None:
        def done(text: str | None) -> None:
            if not text:
                return
            try:
                n = int(text.strip().replace(",", "").replace("_", ""))
            except ValueError:
                self.notify(f"Not a pass number: {text!r}", severity="error")
                return
            if not 0 <= n < self.passes:
                self.notify(f"Pass {n} is out of range (0–{self.passes - 1}).", severity="error")
                return
            self.select_pass(n)

        self.push_screen(Prompt("Go to pass:", placeholder=f"0–{max(self.passes - 1, 0)}"), done)

    def resolve_rid(self: TraceApp, prefix: str) -> str | None:
        """The one request whose id starts with ``prefix``; otherwise say why not (and None)."""
        if self.scan is None:
            self.notify("Still building the request index; try again in a moment.", severity="warning")
            return None
        matches = self.scan.rids.matching(prefix, limit=SHOWN_MATCHES + 1)
        if not matches:
            self.notify(f"No request id starts with {prefix!r}.", severity="error")
            return None
        if len(matches) > 1:
            shown = ", ".join(short_rid(rid) for rid in matches[:SHOWN_MATCHES])
            more = "…" if len(matches) > SHOWN_MATCHES else ""
            self.notify(f"{prefix!r} starts several request ids ({shown}{more}): type more of it.",
                        severity="warning")
            return None
        return matches[0]

    def found_rid(self: TraceApp, rid: str) -> None:
        """``/`` found ``rid``: go to its first pass and highlight it there and wherever it shows."""
        assert self.scan is not None
        span = self.scan.rids[rid]
        self.rid = rid
        self.select_pass(span.first_pass)
        self._show_detail()  # the highlight, even when the pass does not change
        self.set_status(f"request {rid} ({short_rid(rid)}): passes {span.first_pass}–{span.last_pass}; "
                        "r: its life, f rid: its passes")

    def action_find_rid(self: TraceApp) -> None:
        def done(text: str | None) -> None:
            prefix = (text or "").strip()
            rid = self.resolve_rid(prefix) if prefix else None
            if rid is not None:
                self.found_rid(rid)

        self.push_screen(Prompt("Find request id (any unique prefix):", placeholder="rid"), done)

    def action_filter(self: TraceApp) -> None:
        fixes = ", ".join(sorted(self.replay.fixes)) or "none"
        arms = ", ".join(self.marks.arms) or "none"

        def done(text: str | None) -> None:
            if text is None:
                return
            if not text.strip():
                self.post_message(FilterReady(None, None))
                return
            try:
                flt = PassFilter.parse(text)
            except ValueError as exc:
                self.notify(str(exc), severity="error")
                return
            if flt.needs_replay and self.arms is None:
                self.notify("No replay loaded: only result, stall and rid filters work.", severity="warning")
                return
            if flt.kind == "rid":
                rid = self.resolve_rid(flt.value)
                if rid is None:
                    return
                flt = PassFilter("rid", rid, flt.inverse)
            self.compute_filter(flt)

        self.push_screen(
            Prompt("Filter passes (empty clears):", placeholder=SYNTAX,
                   hint=f"fixes: {fixes}; arms: {arms}; results: {' '.join(OUTCOMES)}"),
            done,
        )
