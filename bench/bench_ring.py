"""Ring mode's window: passes a MiB of ring holds, v2 (keyframes and deltas, the ring now) against v1.

    python -m bench.bench_ring [--mib 1] [--passes 3000] [--rounds 3]

The records of each case are fed to ``Ring`` (tracer/recorder/ring.py) as the
writer thread hands them over (one batch per 50 ms of records). The baseline,
measured in the same run, is what the ring kept before (every record v1
encoded, the newest that fit): the longest tail of the records whose v1
encodings fit the same capacity. Cases: the sample traces (the sandbox under
the demo's overload) and synthetic backlogs of 40 and 1,000 waiting
requests (schedtrace/testing/synthetic.py, sglang-length rids). Also the
writer-thread time per record to keep it (v1: encoding it; v2: ``Ring.add``),
beside file mode's v2 writer on the same records (``TraceWriter.write_many``),
and to write a window out (``Ring.take``), best of ``--rounds``.

Nothing is asserted: figures and ratios only.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import click
import msgspec

from bench.bench_size import SAMPLES, flushes, read_all, write
from schedtrace.tracer.contract.format import encode_into
from schedtrace.tracer.contract.schema import Header, Pass, Record
from schedtrace.testing.synthetic import generate
from schedtrace.tracer.recorder.ring import Ring


def v1_window(records: list[Record], capacity: int) -> tuple[int, int, float]:
    """(passes, bytes, seconds): the longest tail whose v1 encodings fit ``capacity``, as the v1 ring kept it."""
    started = time.perf_counter()
    sizes = []
    buffer = bytearray()
    for record in records:  # the old ring's work: encode every record
        buffer.clear()
        encode_into(record, buffer)
        sizes.append(len(buffer))
    spent = time.perf_counter() - started
    held = passes = 0
    for record, size in zip(reversed(records), reversed(sizes)):
        if held + size > capacity:
            break
        held += size
        passes += type(record) is Pass
    return passes, held, spent


def v2_window(records: list[Record], capacity: int) -> tuple[int, int, float, float, bool]:
    """(passes, bytes, seconds to add, seconds to take, whether the window equals the originals' tail)."""
    batches = list(flushes([msgspec.structs.replace(r) if type(r) is Pass else r for r in records]))
    ring = Ring(capacity)
    started = time.perf_counter()
    for batch in batches:
        ring.add(batch)
    added = time.perf_counter() - started
    held = ring.size
    started = time.perf_counter()
    window, _ = ring.take()
    taken = time.perf_counter() - started
    unnumbered = [msgspec.structs.replace(r, seq=0) if type(r) is Pass else r for r in window]
    tail = [msgspec.structs.replace(r, seq=0) if type(r) is Pass else r for r in records[len(records) - len(window):]]
    return sum(type(r) is Pass for r in window), held, added, taken, unnumbered == tail


def cases(folder: Path, passes: int) -> dict[str, tuple[Header, list[Record]]]:
    out = {sample.stem: read_all(sample)[:2] for sample in SAMPLES}
    for queue in (40, 1000):
        path = folder / f"backlog{queue}.trace"
        generate(path, passes, seed=5, backlog=queue, rid_digits=31)
        out[f"backlog {queue} waiting"] = read_all(path)[:2]
    return out


def file_v2_seconds(folder: Path, header: Header, records: list[Record]) -> float:
    """File mode's cost for the same records: ``TraceWriter.write_many`` in v2, per 50 ms batch."""
    return write(folder / "file.trace", header, list(flushes(records)), 2)


@click.command()
@click.option("--mib", type=float, default=1.0, show_default=True, help="Ring capacity.")
@click.option("--passes", type=int, default=3000, show_default=True, help="Passes of each synthetic backlog.")
@click.option("--rounds", type=int, default=3, show_default=True)
def main(mib: float, passes: int, rounds: int) -> None:
    capacity = int(mib * (1 << 20))
    with tempfile.TemporaryDirectory(prefix="bench-ring-") as tmp:
        folder = Path(tmp)
        workloads = cases(folder, passes)
        file_cost = {name: min(file_v2_seconds(folder, header, records) for _ in range(rounds))
                     for name, (header, records) in workloads.items()}
    print(f"ring of {mib:g} MiB: passes held and passes per MiB held (the density of the window), v1 (the ring "
          f"before) against v2 (the ring now); writer-thread time per record, best of {rounds}")
    print(f"{'case':24} {'passes':>6} {'v1 held':>7} {'v2 held':>7} {'v1 /MiB':>8} {'v2 /MiB':>8} {'v2/v1':>6} "
          f"{'v1 us/rec':>9} {'v2 us/rec':>9} {'file v2':>7} {'take ms':>7} {'exact':>5}")
    for name, (_, records) in workloads.items():
        total = sum(type(r) is Pass for r in records)
        v1 = [v1_window(records, capacity) for _ in range(rounds)]
        v2 = [v2_window(records, capacity) for _ in range(rounds)]
        (held1, bytes1, _), (held2, bytes2, *_) = v1[0], v2[0]
        dense1, dense2 = held1 / bytes1 * (1 << 20), held2 / bytes2 * (1 << 20)
        print(f"{name:24} {total:>6} {held1:>7} {held2:>7} {dense1:>8.0f} {dense2:>8.0f} {dense2 / dense1:>5.1f}x "
              f"{min(r[2] for r in v1) / len(records) * 1e6:>9.2f} {min(r[2] for r in v2) / len(records) * 1e6:>9.2f} "
              f"{file_cost[name] / len(records) * 1e6:>7.2f} {min(r[3] for r in v2) * 1e3:>7.1f} {str(all(r[4] for r in v2)):>5}")
    print("held: passes in the window (all of a case's when it fits); /MiB: passes per MiB of the ring's bytes; "
          "file v2: file mode's writer on the same records (us/rec); exact: the window, decoded, equals the "
          "records it kept")


if __name__ == "__main__":
    main()
