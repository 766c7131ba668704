"""Cost of batch framing and checksums: the framed trace format against v1, in the same run.

    python -m bench.bench_format [--records 60000] [--batch 200] [--rounds 5]

Records are the two sample traces' (traces/*.trace), repeated and renumbered
to ``--records``. Each figure is the best of ``--rounds``:

* writer: ``TraceWriter.write_many`` in batches of ``--batch`` records (about
  one writer-thread wake-up under load), per record; framed vs v1 with no
  fsync, and framed with the default durability policy (fsync every 1 s and
  twice at close) for what the policy adds on this disk;
* reader: ``records()`` over the whole file, per pass record (a framed file
  is checked first: one hash of the data, then the same walk as v1);
  ``pass_at`` over every pass in random order, per pass; opening a file and
  asking ``closed_cleanly`` (v1: one step over every record; framed: one
  hash), per MB.

Nothing is asserted; the ratios are framed / v1.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import click
import msgspec

from schedtrace.tracer.contract.format import DEFAULT_FSYNC_EVERY_S, TraceReader, TraceWriter
from schedtrace.tracer.contract.schema import Header, Pass, Record

SAMPLES = sorted((Path(__file__).resolve().parent.parent / "traces").glob("*.trace"))


def load_records(count: int) -> tuple[Header, list[Record]]:
    pool: list[Record] = []
    header = None
    for sample in SAMPLES:
        with TraceReader(sample) as reader:
            header = header or reader.header
            pool += [r for _, r in reader.records()][1:]
    records, seq = [], 0
    while len(records) < count:
        for record in pool[: count - len(records)]:
            if type(record) is Pass:
                record = msgspec.structs.replace(record, seq=seq)
                seq += 1
            records.append(record)
    return header, records


def best(rounds: int, run: Callable[[], float]) -> float:
    return min(run() for _ in range(rounds))


def write_file(path: Path, header: Header, records: list[Record], batch: int, *, framed: bool,
               fsync_every_s: float | None) -> float:
    start = time.perf_counter()
    writer = TraceWriter(path, header, framed=framed, version=1, fsync_every_s=fsync_every_s)
    for at in range(0, len(records), batch):
        writer.write_many(records[at : at + batch])
    if fsync_every_s is None:
        writer.abandon()  # no footer: the close's two fsyncs are the policy's, measured below
    else:
        writer.close(1)
    return time.perf_counter() - start


def closed_file(path: Path, header: Header, records: list[Record], batch: int, framed: bool) -> Path:
    writer = TraceWriter(path, header, framed=framed, version=1, fsync_every_s=None)
    for at in range(0, len(records), batch):
        writer.write_many(records[at : at + batch])
    writer.close(1)
    return path


def read_all(path: Path) -> float:
    start = time.perf_counter()
    with TraceReader(path) as reader:
        for _ in reader.records():
            pass
    return time.perf_counter() - start


def random_access(path: Path, order: list[int]) -> float:
    with TraceReader(path) as reader:
        reader.pass_count  # index (and, framed, the check) once, outside the timing
        start = time.perf_counter()
        for n in order:
            reader.pass_at(n)
        return time.perf_counter() - start


def open_and_check(path: Path) -> float:
    start = time.perf_counter()
    with TraceReader(path) as reader:
        assert reader.closed_cleanly
    return time.perf_counter() - start


@click.command()
@click.option("--records", "count", type=int, default=60_000, show_default=True)
@click.option("--batch", type=int, default=200, show_default=True)
@click.option("--rounds", type=int, default=5, show_default=True)
def main(count: int, batch: int, rounds: int) -> None:
    header, records = load_records(count)
    passes = sum(1 for r in records if type(r) is Pass)
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        w_v1 = best(rounds, lambda: write_file(tmp / "w1.trace", header, records, batch, framed=False,
                                               fsync_every_s=None))
        w_framed = best(rounds, lambda: write_file(tmp / "wf.trace", header, records, batch, framed=True,
                                                   fsync_every_s=None))
        w_durable = best(rounds, lambda: write_file(tmp / "wd.trace", header, records, batch, framed=True,
                                                    fsync_every_s=DEFAULT_FSYNC_EVERY_S))
        v1 = closed_file(tmp / "r1.trace", header, records, batch, framed=False)
        framed = closed_file(tmp / "rf.trace", header, records, batch, framed=True)
        order = list(range(passes))
        random.Random(1).shuffle(order)
        r_v1, r_framed = best(rounds, lambda: read_all(v1)), best(rounds, lambda: read_all(framed))
        p_v1, p_framed = best(rounds, lambda: random_access(v1, order)), best(rounds, lambda: random_access(framed, order))
        c_v1, c_framed = best(rounds, lambda: open_and_check(v1)), best(rounds, lambda: open_and_check(framed))
        mb_v1, mb_framed = v1.stat().st_size / 1e6, framed.stat().st_size / 1e6
    print(f"{count} records ({passes} passes), batches of {batch}; v1 file {mb_v1:.1f} MB, framed {mb_framed:.1f} MB "
          f"(x{mb_framed / mb_v1:.4f})")
    rows = [
        ("writer, per record", w_v1 / count, w_framed / count, "µs"),
        ("reader records(), per pass", r_v1 / passes, r_framed / passes, "µs"),
        ("reader pass_at(n), per pass", p_v1 / passes, p_framed / passes, "µs"),
        ("open + closed_cleanly, per MB", c_v1 / mb_v1, c_framed / mb_framed, "µs"),
    ]
    print(f"{'':32} {'v1':>10} {'framed':>10} {'framed/v1':>10}")
    for name, old, new, unit in rows:
        print(f"{name:32} {old * 1e6:>8.2f}{unit} {new * 1e6:>8.2f}{unit} {new / old:>10.2f}")
    print(f"{'writer + fsync policy, per record':32} {'':>10} {w_durable / count * 1e6:>8.2f}µs "
          f"{w_durable / w_v1:>10.2f}  (framed, fsync every {DEFAULT_FSYNC_EVERY_S:g} s and at close)")


if __name__ == "__main__":
    main()
