"""The browser's ranks and damage: switch ranks (``[`` ``]``), the ranks' comparison, the gaps and losses.

A mixin of ``TraceApp`` (app.py), as ``prompts.py`` is. Every rank of the
run is read as one continuous trace (``rank_set.open_rank``); switching
opens the other rank's readers and scans it afresh. The comparison of the
ranks (``analysis.ranks``, the one ``schedtrace ranks`` prints) and each
rank's gaps are found in thread workers. A replay (``--report``,
``--old/--new``) is of the rank shown first: other ranks show none.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING

from rich.text import Text

from schedtrace.tracer.contract.errors import TraceDamagedError
from schedtrace.tracer.contract.schema import Pass
from schedtrace.tui import workers
from schedtrace.tui.messages import GapsFound, RanksCompared
from schedtrace.tui.model.damage import GapView
from schedtrace.tui.model.rank_set import label_of, open_rank
from schedtrace.tui.model.replay_index import ReplayIndex
from schedtrace.tui.model.rows import ListedPasses
from schedtrace.tui.model.why_lines import WhyLines
from schedtrace.tui.model.pass_cache import PassCache
from schedtrace.tui.widgets.bars import TraceHeader
from schedtrace.tui.widgets.pass_list import PassList
from schedtrace.tui.widgets.rank_lines import damage_lines, damage_report, desync_lines, dp_lines
from schedtrace.tui.widgets.screens import TextScreen

if TYPE_CHECKING:
    from schedtrace.tui.app import TraceApp

WORKER_GROUPS = ("index", "scan", "charts", "filter", "request", "gaps")  # a rank's own workers


class RankActions:
    # --- which rank ---

    @property
    def rank_label(self: TraceApp) -> str:
        return label_of(self.reader)

    @property
    def rank_position(self: TraceApp) -> str | None:
        """``tp1 2/4`` for the header; None for a run of one rank (the header shows its tp rank then)."""
        many = self.rank_set is not None and len(self.rank_set) > 1
        return self.rank_set.position(self.rank_index) if many else None

    def action_rank(self: TraceApp, delta: int) -> None:
        if len(self.screen_stack) > 1:
            return  # the request view or a prompt is over the rank it is about
        if self.rank_set is None or len(self.rank_set) < 2:
            self.notify("This trace set has one rank.", severity="information")
            return
        self.show_rank((self.rank_index + delta) % len(self.rank_set))

    def show_rank(self: TraceApp, i: int) -> None:
        """Browse rank ``i`` of the set at the pass selected now (or the nearest it has)."""
        assert self.rank_set is not None
        for group in WORKER_GROUPS:
            self.workers.cancel_group(self, group)
        old = self.shared
        self.run_worker(old.close, thread=True, group="close")  # waits for a cancelled worker: not here
        if self.reader is not self.first_reader:
            self.reader.close()
        self.rank_index = i
        self.attach(self.first_reader if i == self.home_rank else open_rank(self.rank_set.ranks[i]))
        home = i == self.home_rank
        self.replay = self.home_replay if home else ReplayIndex(None)
        self.arms = self.home_arms if home else None
        self.query_one(PassList).cache, self.query_one(PassList).why = self.cache, self.why
        self.query_one(TraceHeader).show(self.reader, self.arms, self.rank_position)
        self.flt, self.rid, self.scan, self.gaps = None, None, None, []
        self.chart_data = self.kv_image = self.queue_image = None
        self.chart_note = "scanning trace…"
        self.report_doubts = [] if not home else self.report_doubts
        self.divergences = len(self.replay.divergences)
        self.passes = self.reader.pass_count if self.reader.closed_cleanly else 0
        self.listed = ListedPasses(self.passes)
        self._rebuild_marks()
        self.set_status(f"rank {self.rank_position}" + ("" if home or self.home_arms is None
                                                        else ": the replay is of another rank, not shown here"))
        self.start_rank()

    def attach(self: TraceApp, reader) -> None:
        """Read ``reader``'s trace from now on: the UI thread's reader, its caches, the workers' reader."""
        self.reader = reader
        self.trace_path = reader.path
        self.cache = PassCache(reader)
        self.why = WhyLines(reader.header)
        self.shared = workers.SharedReader(reader)
        self.sub_title = self.rank_position or ""

    def start_rank(self: TraceApp) -> None:
        """Index (if it has no footer), scan and check the rank shown; find its gaps."""
        if self.reader.closed_cleanly:
            self._show_passes()
        else:
            self.set_status("indexing an unclosed or damaged trace…")
            self.index_trace()
        # After the first frame: the scan thread competes with the UI thread for the GIL.
        self.call_after_refresh(self.scan_trace)
        self.call_after_refresh(self.find_gaps)
        if self.reader.closed_cleanly and self.rank_index == self.home_rank:
            self.call_after_refresh(self.check_report)

    # --- worker messages ---

    def on_ranks_compared(self: TraceApp, message: RanksCompared) -> None:
        self.desync = message.desync
        self.ranks_verdict = (message.desync.summary(self.rank_label), message.desync.report.verdict == "desync")
        self._rebuild_marks()
        self._show_detail()

    def on_gaps_found(self: TraceApp, message: GapsFound) -> None:
        if message.rank != self.rank_index:
            return  # of the rank shown before a switch
        self.gaps = message.gaps
        self._rebuild_marks()
        self._show_detail()
        if message.gaps:
            self.set_status(f"{len(message.gaps)} gap(s) in this trace: x jumps to each, i lists them", error=True)

    # --- what the detail pane adds at a pass ---

    def gaps_at(self: TraceApp, n: int) -> list[GapView]:
        return [gap for gap in self.gaps if gap.position == n or gap.first_lost <= n < gap.stop]

    def rank_events(self: TraceApp, n: int, p: Pass) -> list[Text]:
        """The desync, the DP ranks, the gaps and losses at pass ``n`` (read as ``p``)."""
        out: list[Text] = []
        label = self.rank_label
        if self.desync is not None:
            diff = self.desync.at(label, n)
            if diff is not None:
                out.extend(desync_lines(diff, label))
            elif self.marks.is_desync(n):
                out.append(Text("≠ the ranks disagree here (the fields are kept for the first passes only)"))
            cells = self.desync.dp_at(label, p.t_ns)
            if cells:
                out.extend(dp_lines(cells, label))
        losses = self.scan.loss_events if self.scan is not None else []
        at = bisect_left(losses, n, key=lambda loss: loss.after)
        here = []
        while at < len(losses) and losses[at].after == n:
            here.append(losses[at])
            at += 1
        out.extend(damage_lines(self.gaps_at(n), here))
        return out

    def lost_detail(self: TraceApp, n: int, exc: TraceDamagedError) -> list[Text]:
        gaps = self.gaps_at(n)
        why = "" if gaps else f": {exc.gap.describe()}"
        return [Text(f"Pass {n} was lost in a gap{why}", style="bold red", overflow="fold"), *damage_lines(gaps, [])]

    # --- the gaps and losses, listed ---

    def action_integrity(self: TraceApp) -> None:
        losses = self.scan.loss_events if self.scan is not None else []
        total = self.scan.losses if self.scan is not None else 0
        text = damage_report(self.gaps, losses, total, scanned=self.scan is not None,
                             closed=self.reader.closed_cleanly)
        self.push_screen(TextScreen(f"Gaps and losses: {self.trace_path}", text))

    def jump_refused(self: TraceApp, kind: str) -> str | None:
        """Why a jump to the next ``kind`` cannot be made yet (None: it can)."""
        if kind == "divergence" and self.arms is None:
            return ("No replay loaded: open with --report or --old/--new." if self.home_arms is None
                    else "The replay is of another rank.")
        if kind == "desync" and (self.rank_set is None or len(self.rank_set) < 2):
            return "One rank only: there is nothing to compare it with."
        if kind == "desync" and self.desync is None:
            return "Still comparing the ranks…"
        if kind not in ("divergence", "desync") and self.scan is None and not len(self.marks.of(kind)):
            return "Still scanning the trace…"
        return None

    def jump_status(self: TraceApp, kind: str, n: int) -> str:
        """What the status line says after a jump to a desync or to damage."""
        if kind == "desync" and self.desync is not None:
            diff = self.desync.at(self.rank_label, n)
            fields = ", ".join(f.field for f in diff.fields) if diff is not None else "not kept"
            return f"desync at pass {n}: {fields}"
        gaps = self.gaps_at(n)
        if gaps:
            return gaps[0].describe()
        return f"the recorder dropped records after pass {n}"
