"""Ranks bench: the cost of ``schedtrace ranks`` on an 8-rank trace set, against reading the set once.

    python -m bench.bench_ranks [--passes 1000000] [--ranks 8] [--runs 3] [--dir /tmp/schedtrace-bench]

One synthetic trace (schedtrace/testing/synthetic.py) of passes/ranks passes is
written out as the ranks of one run: the same records under one header per
rank (run id, tp rank, pid, start time), each rank rotated into two parts,
as a TP server writes them. A second set differs from the first in one
rank only, whose pass at 90% has another KV count.

Timed, as the median of ``--runs`` rounds (the figures interleaved, so each
sees the same noise):

* ``read``: every record of every rank decoded once through the trace set,
  the floor, since ``ranks`` has to read it all;
* ``ranks agree``: ``compare_ranks`` on the first set;
* ``ranks desync``: the same on the second (the difference spelt out).

Printed as CPU seconds of this process (the machine is shared: wall time
follows the neighbours' load) and wall seconds, each as a ratio to ``read``. Then, unless
``--replay-passes 0``, what ``ranks`` is meant to be cheap against: the
open-loop replay (``replay_trace``, stock against fixed, one job) of a
synthetic trace of N passes from the same generator, timed once after a
warm-up, and the whole set's replay estimated from it at that cost per pass. Then, unless
``--set-passes 0``, a TP8 set that agrees (``--set-passes`` passes per rank, written as above) replayed
as ``schedtrace replay`` replays a set (``replay.rank_groups``: the agreement check, one rank per
agreeing group replayed, the others' reports copied), in CPU seconds against replaying one of its
ranks alone (target: <= 2x; every rank replayed was 8x plus startup). Generated sets are kept in
--dir and reused (same seed, same bytes).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import click
import msgspec

from schedtrace.tracer.analysis.ranks import compare_ranks
from schedtrace.tracer.contract.format import TraceReader, TraceWriter
from schedtrace.tracer.contract.schema import Header, KvSnapshot, Pass
from schedtrace.testing.synthetic import generate
from schedtrace.tracer.contract.traceset import open_traceset

ALTERED_RANK = 5
ALTERED_AT = 0.9  # fraction of the passes


def rank_header(base: Header, rank: int, ranks: int, part: int, first_pass: int) -> Header:
    return msgspec.structs.replace(base, run_id="bench-run", tp_rank=rank, tp_size=ranks, pid=base.pid + rank,
                                   start_wall_ns=base.start_wall_ns + rank * 1_000_000, part=part,
                                   first_pass=first_pass)


def write_sets(source: Path, agree: Path, desync: Path, ranks: int) -> None:
    """Both sets from one pass over ``source``: ``desync`` links every rank but the altered one."""
    agree.mkdir(parents=True, exist_ok=True)
    desync.mkdir(parents=True, exist_ok=True)
    with TraceReader(source) as reader:
        base, total = reader.header, reader.pass_count
        half, altered_seq = total // 2, int(total * ALTERED_AT)
        names = [f"schedtrace-tp{r}-dp0-pid{base.pid + r}" for r in range(ranks)]

        def open_part(part: int, first_pass: int) -> list[TraceWriter]:
            writers = [TraceWriter(agree / f"{name}.part{part:03d}.trace", rank_header(base, r, ranks, part, first_pass))
                       for r, name in enumerate(names)]
            odd = desync / f"{names[ALTERED_RANK]}.part{part:03d}.trace"
            return [*writers, TraceWriter(odd, rank_header(base, ALTERED_RANK, ranks, part, first_pass))]

        writers = open_part(0, 0)
        chunk: list = []

        def flush(altered: list) -> None:
            for writer in writers[:-1]:
                writer.write_many(chunk)
            writers[-1].write_many(altered)
            chunk.clear()

        altered_chunk: list = []
        for _, record in reader.records():
            if type(record) is Header:
                continue
            if type(record) is Pass and record.seq == half:
                flush(altered_chunk)
                altered_chunk = []
                for writer in writers:
                    writer.close(0)
                writers = open_part(1, half)
            chunk.append(record)
            if type(record) is Pass and record.seq == altered_seq:
                record = msgspec.structs.replace(record, kv=KvSnapshot(available=record.kv.available + 1,
                                                                       evictable=record.kv.evictable))
            altered_chunk.append(record)
            if len(chunk) >= 4096:
                flush(altered_chunk)
                altered_chunk = []
        flush(altered_chunk)
        for writer in writers:
            writer.close(0)
    for part in (0, 1):
        for r, name in enumerate(names):
            link = desync / f"{name}.part{part:03d}.trace"
            if r != ALTERED_RANK and not link.exists():
                link.symlink_to(agree / link.name)


def ensure_sets(directory: Path, passes: int, ranks: int) -> tuple[Path, Path]:
    per_rank = passes // ranks
    agree, desync = directory / f"ranks-{ranks}x{per_rank}", directory / f"ranks-{ranks}x{per_rank}-desync"
    if not (agree / "complete").exists():
        directory.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        source = directory / f"ranks-source-{per_rank}.trace"
        generate(source, per_rank, seed=7)
        write_sets(source, agree, desync, ranks)
        source.unlink()
        (agree / "complete").touch()
        size = sum(p.stat().st_size for p in agree.glob("*.trace"))
        print(f"  wrote {ranks} ranks x {per_rank} passes ({size / 1e6:.0f} MB) in "
              f"{time.perf_counter() - started:.0f}s", flush=True)
    return agree, desync


def time_read(path: Path) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    with open_traceset([path]) as traces:
        for rank in traces.run().ranks:
            for _ in rank.records():
                pass
    return time.process_time() - cpu, time.perf_counter() - wall


def time_ranks(path: Path, expect: str) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    with open_traceset([path]) as traces:
        run = traces.run()
        report = compare_ranks(run.ranks, run=run.label)
    elapsed = time.process_time() - cpu, time.perf_counter() - wall
    assert report.verdict == expect, (path, report.verdict)  # a bench of the wrong answer measures nothing
    return elapsed


@click.command()
@click.option("--passes", type=int, default=1_000_000, show_default=True, help="Passes over all ranks.")
@click.option("--ranks", "n_ranks", type=int, default=8, show_default=True)
@click.option("--runs", type=int, default=3, show_default=True)
@click.option("--replay-passes", type=int, default=2000, show_default=True,
              help="Passes of one rank to replay for the comparison (0: skip; imports sglang).")
@click.option("--set-passes", type=int, default=2000, show_default=True,
              help="Passes per rank of the TP8 set replayed whole (0: skip; imports sglang).")
@click.option("--dir", "directory", type=click.Path(path_type=Path), default=Path("/tmp/schedtrace-bench"),
              show_default=True)
def main(passes: int, n_ranks: int, runs: int, replay_passes: int, set_passes: int, directory: Path) -> None:
    agree, desync = ensure_sets(directory, passes, n_ranks)
    figures: dict[str, list[tuple[float, float]]] = {"read": [], "ranks agree": [], "ranks desync": []}
    for _ in range(runs):
        figures["read"].append(time_read(agree))
        figures["ranks agree"].append(time_ranks(agree, "agree"))
        figures["ranks desync"].append(time_ranks(desync, "desync"))
    medians = {name: (statistics.median(v[0] for v in values), statistics.median(v[1] for v in values))
               for name, values in figures.items()}
    read_cpu, read_wall = medians["read"]
    print(f"{n_ranks} ranks, {passes // n_ranks * n_ranks} passes in all, median of {runs}:")
    for name, (cpu, wall) in medians.items():
        print(f"  {name:13} cpu {cpu:7.2f} s {cpu / read_cpu:5.2f}x read   wall {wall:7.2f} s {wall / read_wall:5.2f}x")
    if replay_passes > 0:
        per_pass = replay_cpu_seconds_per_pass(directory, replay_passes)
        whole = per_pass * (passes // n_ranks * n_ranks)
        ranks = medians["ranks agree"][0]
        print(f"  replay        cpu {per_pass * 1e6:7.0f} us/pass over {replay_passes} passes: the set's replay "
              f"~{whole:.0f} s, {whole / ranks:.0f}x ranks")
    if set_passes > 0:
        bench_set_replay(directory, set_passes, TP_SET)


TP_SET = 8


def bench_set_replay(directory: Path, per_rank: int, n_ranks: int) -> None:
    """A whole agreeing TP set replayed as the CLI does it, against one of its ranks alone (CPU, same run)."""
    from schedtrace.replay.engine import replay_trace
    from schedtrace.replay.rank_groups import copied_report, plan_ranks

    agree, _ = ensure_sets(directory, per_rank * n_ranks, n_ranks)
    with open_traceset([agree]) as traces:
        run = traces.run()
        ranks = run.ranks
        replay_trace(ranks[0], jobs=1)  # warm: sglang imported, fixes compiled
        started = time.process_time()
        one = replay_trace(ranks[0], jobs=1)
        one_rank = time.process_time() - started
        started = time.process_time()
        plan = plan_ranks(ranks, run=run.label)
        checked = time.process_time() - started
        reports = {r.label: replay_trace(r, jobs=1) for r in plan.replayed}
        for r in ranks:
            if r.label in plan.same_as:
                reports[r.label] = copied_report(reports[plan.same_as[r.label]], r, plan.same_as[r.label],
                                                 plan.why[r.label])
        whole = time.process_time() - started
    assert len(reports) == n_ranks and len(plan.replayed) == 1, plan.same_as  # the set agrees: one rank replayed
    assert reports[ranks[-1].label].divergences == one.divergences
    print(f"TP{n_ranks} agreeing set, {per_rank} passes per rank: one rank replayed cpu {one_rank:.2f} s; "
          f"the set {whole:.2f} s = {whole / one_rank:.2f}x one rank (agreement check {checked:.2f} s, "
          f"{len(plan.replayed)} rank replayed, {len(plan.same_as)} reported as identical; "
          f"every rank replayed: {n_ranks}x)")


def replay_cpu_seconds_per_pass(directory: Path, passes: int) -> float:
    """Replay cost per pass, on a synthetic trace of ``passes`` passes (same generator and seed)."""
    from schedtrace.replay.engine import replay_trace

    path = directory / f"ranks-replay-{passes}.trace"
    if not path.exists():
        generate(path, passes, seed=7)
    replay_trace(path, jobs=1)  # warm: sglang imported, fixes compiled
    started = time.process_time()
    report = replay_trace(path, jobs=1)
    return (time.process_time() - started) / report.passes


if __name__ == "__main__":
    main()
