"""Cost of the OpenTelemetry mirror (``SCHEDTRACE_OTEL=1``), on vs off in the same run.

    python -m bench.bench_otel [--passes 20000] [--rounds 3]

Records come from a synthetic trace (bench.gen_trace). The mirror uses the
real SDK: a TracerProvider with a BatchSpanProcessor whose exporter discards
the spans (the export itself runs on the processor's own thread; what is
measured is what the recorder's threads pay).

* writer thread: ``TraceWriter.write_many(batch)`` per batch (off) vs the same
  plus ``sink(batch)`` (on), per pass record;
* scheduler thread: a loop that does a fixed amount of work per pass and
  ``WriterThread.submit``s the pass's records while the real writer thread
  drains in the background, with no sink (off) vs the mirror sink (on). The
  submit path does not change; any difference is the writer thread taking
  the GIL for longer. The ratio should stay close to 1.

Figures are best of ``rounds``, printed as µs and ratios; nothing is asserted.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import click
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from schedtrace.testing.synthetic import generate
from schedtrace.tracer.contract.format import TraceReader, TraceWriter
from schedtrace.tracer.export.otel_mirror import make_sink
from schedtrace.tracer.contract.schema import Pass, Record
from schedtrace.tracer.recorder.writer_thread import WriterThread

ON = {"SCHEDTRACE_OTEL": "1"}
BATCH_RECORDS = 200  # about one 50 ms writer wake-up under load
WORK_PER_PASS = 3000  # scheduler-thread stand-in work per pass record (a Python loop, ~100 µs)


class _Discard(SpanExporter):
    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def _provider() -> tuple[TracerProvider, _Discard]:
    exporter = _Discard()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider, exporter


def _load(passes: int, folder: Path) -> tuple[object, list[Record]]:
    path = folder / "bench.trace"
    generate(path, passes)
    with TraceReader(path) as reader:
        return reader.header, [r for _, r in reader.records()]


def _writer_side(header, records: list[Record], folder: Path, mirror: bool) -> tuple[float, float]:
    """(seconds for write+sink, seconds in the sink alone)."""
    provider, exporter = _provider()
    sink = make_sink(header, tracer_provider=provider, environ=ON, configure_sdk=False) if mirror else None
    writer = TraceWriter(folder / f"w{int(mirror)}.trace", header)
    batches = [records[i : i + BATCH_RECORDS] for i in range(0, len(records), BATCH_RECORDS)]
    in_sink = 0.0
    started = time.perf_counter()
    for batch in batches:
        writer.write_many(batch)
        if sink is not None:
            t = time.perf_counter()
            sink(batch)
            in_sink += time.perf_counter() - t
    total = time.perf_counter() - started
    if sink is not None:
        sink.close()
        assert not sink.failed
    writer.close(0)
    provider.shutdown()
    return total, in_sink


def _scheduler_side(header, per_pass: list[list[Record]], folder: Path, mirror: bool, work: int) -> float:
    provider, exporter = _provider()
    sink = make_sink(header, tracer_provider=provider, environ=ON, configure_sdk=False) if mirror else None
    thread = WriterThread(folder, f"s{int(mirror)}", lambda part, first: header, clock_ns=time.monotonic_ns,
                          sinks=[sink] if sink else [], flush_interval_s=0.01)
    started = time.perf_counter()
    for records in per_pass:
        x = 0
        for i in range(work):  # the scheduler's own work between passes
            x += i
        for record in records:
            thread.submit(record)
    elapsed = time.perf_counter() - started
    thread.close()
    if sink is not None:
        sink.close()
    provider.shutdown()
    assert thread.dropped == 0, "queue overflowed; lower --passes"
    return elapsed


def _group_by_pass(records: list[Record]) -> list[list[Record]]:
    groups: list[list[Record]] = [[]]
    for record in records:
        groups[-1].append(record)
        if type(record) is Pass:
            groups.append([])
    return groups


@click.command()
@click.option("--passes", type=int, default=20_000, show_default=True)
@click.option("--rounds", type=int, default=3, show_default=True)
@click.option("--work", type=int, default=WORK_PER_PASS, show_default=True,
              help="Scheduler stand-in loop steps per pass record (smaller: more pass records per second).")
def main(passes: int, rounds: int, work: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-otel-") as tmp:
        folder = Path(tmp)
        header, records = _load(passes, folder)
        n_pass = sum(1 for r in records if type(r) is Pass)
        print(f"{len(records)} records, {n_pass} pass records, batches of {BATCH_RECORDS}")

        off, on, sink_only = [], [], []
        for _ in range(rounds):  # interleaved so drift hits both arms alike
            off.append(_writer_side(header, records, folder, False)[0])
            total, in_sink = _writer_side(header, records, folder, True)
            on.append(total)
            sink_only.append(in_sink)
        per = 1e6 / n_pass
        w_off, w_on, w_sink = min(off) * per, min(on) * per, min(sink_only) * per
        print(f"writer thread, per pass record: off {w_off:.2f} µs, on {w_on:.2f} µs "
              f"(mirror alone {w_sink:.2f} µs); on/off = {w_on / w_off:.2f}x")

        per_pass = _group_by_pass(records)
        s_off, s_on = [], []
        for _ in range(rounds):
            s_off.append(_scheduler_side(header, per_pass, folder, False, work))
            s_on.append(_scheduler_side(header, per_pass, folder, True, work))
        so, sn = min(s_off) * per, min(s_on) * per
        print(f"scheduler thread, per pass ({work}-step work + submit): off {so:.2f} µs, on {sn:.2f} µs; "
              f"on/off = {sn / so:.3f}x (added {sn - so:+.2f} µs)")


if __name__ == "__main__":
    main()
