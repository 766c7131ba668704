"""The browser over a run's ranks and over damaged files (issues 11, 12, 13), driven through Textual's Pilot.

The inputs are real traces: the sample ``hybrid-swa-gptoss.trace`` rewritten
with the project's TraceWriter as the ranks of one run (rank 1 in two parts,
two of its passes deciding otherwise), and a copy of it with a loss record
and one batch's bytes damaged.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from schedtrace.cli import run
from schedtrace.tracer.contract.format import TraceReader, TraceWriter, write_trace
from schedtrace.tracer.contract.schema import Loss, Pass
from schedtrace.testing.synthetic import generate
from schedtrace.tracer.contract.traceset import open_traceset
from schedtrace.tui import workers
from schedtrace.tui.app import TraceApp
from schedtrace.tui.model.rank_set import RankSet, StoppableRank, open_rank
from schedtrace.tui.widgets.pass_list import PassList
from schedtrace.tui.widgets.screens import TextScreen
from test_tui import detail_text, settle  # tests/ is on sys.path

SAMPLE = Path(__file__).resolve().parent.parent / "traces" / "hybrid-swa-gptoss.trace"
with TraceReader(SAMPLE) as _sample:
    SAMPLE_PASSES = _sample.pass_count  # what every copy below must read back, all parts together
    _admitting = [p.seq for p in _sample.passes() if p.admitted]
# Passes that admit in the sample, one in each of rank 1's parts (SPLIT below); rank 1 admits nothing there.
ALTERED = (next(n for n in _admitting if n > 100), next(n for n in _admitting if n > 300))
SPLIT = 200  # rank 1's part 1 starts at this pass
LOSS_AFTER = 60
DAMAGED = 150  # a pass whose bytes the damaged copy breaks
BATCH = 40  # records per write batch of the damaged copy
SIZE = (150, 44)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def sample_records() -> tuple[object, list]:
    with TraceReader(SAMPLE) as reader:
        return reader.header, [record for offset, record in reader.records() if offset]


def write_run(folder: Path, *, altered: tuple[int, ...] = ALTERED, dp_attention: bool = False) -> Path:
    """Two ranks of one run from the sample's records; rank 1 in two parts, deciding otherwise at ``altered``."""
    folder.mkdir()
    header, records = sample_records()
    for rank in (0, 1):
        ranks = ({"dp_rank": rank, "dp_size": 2, "attn_dp_rank": rank, "attn_dp_size": 2} if dp_attention
                 else {"tp_rank": rank, "tp_size": 2})
        head = msgspec.structs.replace(header, run_id="tui-ranks", pid=header.pid + rank, **ranks)
        mine = [msgspec.structs.replace(r, admitted=[]) if rank and type(r) is Pass and r.seq in altered else r
                for r in records]
        cut = next(i for i, r in enumerate(mine) if type(r) is Pass and r.seq == SPLIT) if rank else len(mine)
        pieces = [(0, mine[:cut]), (SPLIT, mine[cut:])] if rank else [(0, mine)]
        for part, (first, chunk) in enumerate(pieces):
            name = f"schedtrace-tui-ranks-tp{head.tp_rank}-dp{rank if dp_attention else 0}-pid{head.pid}"
            write_trace(folder / f"{name}.part{part:03d}.trace",
                        msgspec.structs.replace(head, part=part, first_pass=first), chunk)
    return folder


def write_damaged(path: Path) -> tuple[int, int, int]:
    """The sample with a loss record after pass LOSS_AFTER, then the bytes of pass DAMAGED broken:
    (gap start, gap end, passes that cannot be read)."""
    header, records = sample_records()
    at = next(i for i, r in enumerate(records) if type(r) is Pass and r.seq == LOSS_AFTER) + 1
    records.insert(at, Loss(records[at - 1].t_ns + 1, 7, "queue_full"))
    writer = TraceWriter(path, header)
    for i in range(0, len(records), BATCH):  # batches as the recorder writes them: a gap is one of them
        writer.write_many(records[i : i + BATCH])
    writer.close(records[-1].t_ns)
    with TraceReader(path) as reader:
        offset = reader.pass_offsets[DAMAGED]
    data = bytearray(path.read_bytes())
    data[offset + 5] ^= 0xFF
    path.write_bytes(bytes(data))
    with TraceReader(path, skip_damaged=True) as reader:
        (gap,) = reader.gaps
        return gap.start, gap.end, reader.pass_count - sum(1 for _ in reader.passes())


def app_for(paths: list[Path], rank: int = 0, **options: object) -> tuple[TraceApp, object]:
    traces = open_traceset(paths)
    ranks = traces.run().ranks
    return TraceApp(open_rank(ranks[rank]), ranks=RankSet("tui-ranks", ranks), rank=rank, **options), traces


def header_text(app: TraceApp) -> str:
    return app.query_one("#trace-header").text().plain


def assert_centred(app: TraceApp) -> None:
    pass_list = app.query_one(PassList)
    middle = int(pass_list.scroll_y) + pass_list.scrollable_content_region.height // 2
    assert abs(pass_list.cursor - middle) <= 1


async def test_brackets_switch_ranks_and_a_rank_of_two_parts_reads_as_one(tmp_path):
    app, traces = app_for([write_run(tmp_path / "run")])
    with traces:
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            assert "rank tp0 1/2" in header_text(app) and app.passes == SAMPLE_PASSES
            await pilot.press("g", *"300", "enter")
            await pilot.press("right_square_bracket")
            await settle(app, pilot)
            assert "rank tp1 2/2" in header_text(app)
            assert app.passes == SAMPLE_PASSES and app.scan.passes == SAMPLE_PASSES  # both parts, numbered on
            assert app.selected == 300 and "Pass 300 " in detail_text(app)  # pass 300 is in part 1
            with TraceReader(SAMPLE) as sample:
                assert app.cache.get(300).t_ns == sample.pass_at(300).t_ns
            await pilot.press("left_square_bracket")
            await settle(app, pilot)
            assert "rank tp0 1/2" in header_text(app) and app.reader is app.first_reader


async def test_d_walks_the_desync_passes_centred_with_the_differing_fields(tmp_path):
    app, traces = app_for([write_run(tmp_path / "run")], rank=1)
    with traces:
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            assert list(app.marks.desync) == list(ALTERED)
            assert "DESYNC 2 passes" in header_text(app)
            await pilot.press("d")
            assert app.selected == ALTERED[0]
            await pilot.press("d")
            assert app.selected == ALTERED[1]
            assert_centred(app)
            text = detail_text(app)
            assert "ranks disagree (tp): this rank differs from tp0; same inputs, another decision" in text
            assert "decision.admitted" in text and f"desync at pass {ALTERED[1]}: decision.admitted" in app.status_text
            assert app.marks.kind_at(ALTERED[1]) == "desync"
            await pilot.press("D")
            assert app.selected == ALTERED[0]
            await pilot.press("d", "d")
            assert app.selected == ALTERED[1]  # no later desync: it stays


async def test_ranks_that_agree_mark_nothing(tmp_path):
    app, traces = app_for([write_run(tmp_path / "run", altered=())])
    with traces:
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            assert "ranks agree (tp)" in header_text(app) and not len(app.marks.desync)


async def test_dp_attention_ranks_that_differ_are_not_a_desync_and_show_side_by_side(tmp_path):
    app, traces = app_for([write_run(tmp_path / "run", dp_attention=True)], rank=1)
    with traces:
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            assert "rank dp1.tp0 2/2" in header_text(app)
            assert not len(app.marks.desync) and "agree (dp-attention)" in header_text(app)
            await pilot.press("g", *str(ALTERED[0]), "enter")
            text = detail_text(app)
            assert "ranks disagree" not in text
            assert "DP ranks in this time slice" in text and "dp0.tp0" in text and "dp1.tp0" in text


async def test_a_damaged_copy_browses_and_lists_its_gap_and_loss(tmp_path):
    path = tmp_path / "damaged.trace"
    start, end, unreadable = write_damaged(path)
    app, traces = app_for([path])
    with traces:
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            (gap,) = app.gaps
            assert (gap.start, gap.end) == (start, end) and LOSS_AFTER < gap.first_lost <= DAMAGED < gap.stop
            assert gap.passes_lost == unreadable and gap.position == gap.first_lost
            header = header_text(app)
            assert f"DAMAGED 1 gap, {gap.passes_lost} passes lost" in header
            assert "unclosed" not in header and "cleanly" not in header
            assert app.scan.passes == app.passes == SAMPLE_PASSES  # every pass after the gap is read too
            await pilot.press("x")
            assert app.selected == LOSS_AFTER and "dropped 7 records after this pass (queue_full)" in detail_text(app)
            await pilot.press("x")
            assert app.selected == gap.position
            assert f"bytes {start:,}–{end:,}" in app.status_text
            assert f"Pass {gap.first_lost} was lost" in detail_text(app)
            line = app.query_one(PassList).render_line(app.query_one(PassList).cursor
                                                       - int(app.query_one(PassList).scroll_y)).text
            assert "▒" in line and "lost in the gap" in line
            await pilot.press("i")
            await pilot.pause()
            assert isinstance(app.screen, TextScreen)
            listed = app.screen.text.plain
            assert f"bytes {start:,}–{end:,}" in listed and f"passes {gap.first_lost}–{gap.stop - 1} lost" in listed
            assert "7 records after pass 60 (queue_full)" in listed
            await pilot.press("escape")
            await pilot.press("g", *str(gap.stop), "enter")
            assert f"Pass {gap.stop} " in detail_text(app)  # the first pass after the gap reads


def test_tui_takes_stall_passes_and_refuses_a_bad_one(tmp_path, capsys):
    assert run(["tui", str(SAMPLE), "--stall-passes", "0"]) == 2
    err = capsys.readouterr().err
    assert "--stall-passes" in err and "Traceback" not in err


async def test_stall_passes_sets_the_recorded_stall_bands(tmp_path):
    path = tmp_path / "planted.trace"
    generate(path, 1200, seed=3)  # planted stalls, each under 60 passes long
    stalls = {}
    for threshold in (8, 60):
        app = TraceApp(TraceReader(path), stall_passes=threshold)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            stalls[threshold] = app.marks.stall_runs()
    assert stalls[8] and not stalls[60]


def test_a_cancelled_comparison_stops_and_posts_nothing(tmp_path):
    """Quitting cancels the comparison worker: its reads end at once and no half result is shown."""
    posted: list = []
    with open_traceset([write_run(tmp_path / "run")]) as traces:
        ranks = RankSet("tui-ranks", traces.run().ranks)
        assert not list(StoppableRank(ranks.ranks[1], lambda: True).records())
        assert len(list(StoppableRank(ranks.ranks[1], lambda: False).records())) > SAMPLE_PASSES
        workers.compare(ranks, posted.append, cancelled=lambda: True)
        assert posted == []
        workers.compare(ranks, posted.append, cancelled=lambda: False)
    (compared,) = posted
    assert list(compared.desync.of("tp1")) == list(ALTERED)


def test_a_gap_in_a_later_part_is_named_by_its_file_and_numbered_on(tmp_path):
    from schedtrace.tui.model.damage import gap_views, reader_gaps

    folder = write_run(tmp_path / "run")
    (part1,) = folder.glob("*tp1*part001.trace")
    with TraceReader(part1) as reader:
        offset = reader.pass_offsets[100]
    data = bytearray(part1.read_bytes())
    data[offset + 5] ^= 0xFF
    part1.write_bytes(bytes(data))
    with open_traceset([folder], skip_damaged=True) as traces:
        rank = open_rank(traces.run().ranks[1])
        gaps = reader_gaps(rank)
    with TraceReader(part1, skip_damaged=True) as alone:
        expected = gap_views(alone.gaps, alone.pass_offsets, part1.name, SPLIT)
    assert gaps == expected and len(gaps) == 1
    assert gaps[0].file == part1.name and gaps[0].first_lost >= SPLIT and gaps[0].passes_lost > 0
