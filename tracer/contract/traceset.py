"""Trace sets: the files of one or more server runs, grouped by run, rank and part.

``open_traceset`` takes files, directories (their ``*.trace`` files) and glob
patterns and reads only headers and footers. Run: the header's ``run_id``
(without one: host + pid + start time, one run per process, so two runs with
the same pid never mix). Rank: (pp, dp, tp) within the run, one process.
Part: ordered by ``Header.part``; a missing or duplicate part, or one whose
pass numbers do not continue the part before it, is a ``TraceSetError``
naming the files (docs/trace-format.md, "Trace sets and ranks").

``RankTrace`` reads one rank's parts as one continuous trace behind the
``TraceReader`` interface (docs/ranks.md lists what differs).
"""

from __future__ import annotations

import os
from array import array
from bisect import bisect_right
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Final

import msgspec

from schedtrace.tracer.contract.errors import TraceSetError
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.framing import Gap
from schedtrace.tracer.contract.fingerprint import combined_fingerprint
from schedtrace.tracer.contract.paths import MAX_FILES, expand_paths
from schedtrace.tracer.contract.rank_keys import RankKey, rank_key, rank_label, run_key, shown
from schedtrace.tracer.contract.schema import Header, Pass, Record
from schedtrace.tracer.contract.set_checks import missing_ranks, ordered_parts

OPEN_PARTS: Final = 4  # part readers a rank keeps open (a long run has hundreds of parts; fds are finite)


@dataclass
class TracePart:
    """One file of a rank: what its header and footer said when the set was opened."""

    path: Path
    header: Header
    file_size: int
    has_footer: bool  # the footer's pass index was read (closed_cleanly also checks every byte: not at open)
    pass_count: int | None  # None: no footer and not scanned yet
    clean: bool | None = None  # closed_cleanly, once a reader of it has checked
    skip_damaged: bool = False  # read on past unreadable regions (TraceReader's option)

    def reader(self) -> TraceReader:
        return TraceReader(self.path, skip_damaged=self.skip_damaged)

    def passes(self) -> int:
        if self.pass_count is None:
            with self.reader() as reader:
                self.pass_count = reader.pass_count  # one linear scan
        return self.pass_count


class RankTrace:
    """One rank's parts read as one trace, with the ``TraceReader`` interface.

    Byte offsets are global: part k's are shifted by the sizes of the parts
    before it, so ``records(start)``, ``record_at`` and ``pass_offsets`` work
    across parts. Pass indices run over every part (``pass_at(n)`` is pass
    ``header.first_pass + n``). ``records()`` yields the first part's header
    only. At most ``OPEN_PARTS`` parts stay open. Parts opened with
    ``skip_damaged`` read on past their gaps; ``gaps`` lists them, in global offsets.
    """

    def __init__(self, *, label: str, key: RankKey, parts: list[TracePart]) -> None:
        self.label = label
        self.key = key
        self.parts = tuple(parts)
        self.header = parts[0].header
        self.path = str(parts[0].path)
        self._bases = [0, *accumulate(p.file_size for p in parts)][:-1]
        self._pass_starts = [p.header.first_pass - self.header.first_pass for p in parts]
        self._open: OrderedDict[int, TraceReader] = OrderedDict()
        self._busy: list[tuple[int, TraceReader]] = []  # readers out of the cache, in a sequential read
        self._unknown: Counter[str] = Counter()
        self._torn: dict[int, int] = {}  # part index -> local offset of its torn tail
        self._pass_offsets: array | None = None

    # --- facts ---

    @property
    def closed_cleanly(self) -> bool:
        """Every part has a checked footer and no unreadable region (each part is checked once)."""
        for i, part in enumerate(self.parts):
            if part.clean is None:
                part.clean = part.has_footer and self._reader(i).closed_cleanly
            if not part.clean:
                return False
        return True

    @property
    def file_size(self) -> int:
        return sum(p.file_size for p in self.parts)

    @property
    def skip_damaged(self) -> bool:
        return self.parts[0].skip_damaged

    @property
    def gaps(self) -> list[Gap]:
        """Every part's unreadable regions, in order, offsets global (each part is checked once)."""
        found: list[Gap] = []
        for (_, gaps, _), base in zip(self.part_gaps(), self._bases):
            found.extend(msgspec.structs.replace(g, start=g.start + base, end=g.end + base,
                                                 first_bad=None if g.first_bad is None else g.first_bad + base)
                         for g in gaps)
        return found

    def part_gaps(self) -> Iterator[tuple[TracePart, list[Gap], array]]:
        """Each part with its own unreadable regions and pass index, offsets local to its file."""
        for i, part in enumerate(self.parts):
            reader = self._reader(i)
            yield part, reader.gaps, reader.pass_offsets

    def fingerprint(self) -> str:
        """Names these exact parts: one part's own fingerprint, or a hash of every part's."""
        return combined_fingerprint([self._reader(i).fingerprint() for i in range(len(self.parts))])

    @property
    def data_end(self) -> int:
        return self._bases[-1] + self._reader(len(self.parts) - 1).data_end

    @property
    def truncated_at(self) -> int | None:
        """Global offset of the first torn tail, of the parts read so far."""
        for i, reader in self._readers():
            if reader.truncated_at is not None:
                self._torn.setdefault(i, reader.truncated_at)
        first = min(self._torn, default=None)
        return None if first is None else self._bases[first] + self._torn[first]

    @property
    def unknown_records(self) -> Counter[str]:
        """Records of unknown tags skipped so far, over every part (a snapshot)."""
        total = Counter(self._unknown)
        for _, reader in self._readers():
            total.update(reader.unknown_records)
        return total

    @property
    def pass_count(self) -> int:
        return self._pass_starts[-1] + self.parts[-1].passes()

    @property
    def pass_offsets(self) -> array:
        if self._pass_offsets is None:
            offsets = array("Q")
            for i, base in enumerate(self._bases):
                local = self._reader(i).pass_offsets
                offsets.extend(local if base == 0 else (o + base for o in local))
            self._pass_offsets = offsets
        return self._pass_offsets

    # --- reading ---

    def records(self, start: int = 0) -> Iterator[tuple[int, Record]]:
        """Every known record of every part in order, with its global offset (footers excluded)."""
        first = max(bisect_right(self._bases, start) - 1, 0)
        for i in range(first, len(self.parts)):
            base = self._bases[i]
            with _Streaming(self, i) as reader:
                for offset, record in reader.records(start - base if i == first else 0):
                    if i and offset == 0:
                        continue  # a later part's own header: the trace has one
                    yield base + offset, record

    def passes(self, start: int = 0, stop: int | None = None) -> Iterator[Pass]:
        stop = self.pass_count if stop is None else min(stop, self.pass_count)
        start = max(start, 0)
        for i, first in enumerate(self._pass_starts):
            end = self._pass_starts[i + 1] if i + 1 < len(self.parts) else stop
            if end <= start or first >= stop:
                continue
            with _Streaming(self, i) as reader:
                yield from reader.passes(max(start - first, 0), min(stop, end) - first)

    def pass_at(self, n: int) -> Pass:
        count = self.pass_count
        if not 0 <= n < count:
            raise IndexError(f"pass {n} out of range (trace has {count})")
        i = bisect_right(self._pass_starts, n) - 1
        return self._reader(i).pass_at(n - self._pass_starts[i])

    def record_at(self, offset: int) -> Record | None:
        i = max(bisect_right(self._bases, offset) - 1, 0)
        return self._reader(i).record_at(offset - self._bases[i])

    def release_pages(self, upto: int) -> None:
        for i, reader in self._readers():
            if self._bases[i] < upto:
                reader.release_pages(upto - self._bases[i])

    # --- lifecycle ---

    def close(self) -> None:
        self._evict(keep=0)

    def _evict(self, keep: int) -> None:
        """Close the least recently used part readers until ``keep`` are open."""
        while len(self._open) > keep:
            self._retire(*self._open.popitem(last=False))

    def _readers(self) -> list[tuple[int, TraceReader]]:
        return [*self._open.items(), *self._busy]

    def _reader(self, i: int) -> TraceReader:
        """Part ``i``'s reader for random access (opened on demand, the least recent closed)."""
        reader = self._open.get(i)
        if reader is not None:
            self._open.move_to_end(i)
            return reader
        reader = self._open[i] = self._open_part(i)
        self._evict(keep=OPEN_PARTS)
        return reader

    def _open_part(self, i: int) -> TraceReader:
        part = self.parts[i]
        reader = part.reader()
        if reader.header != part.header or (i + 1 < len(self.parts) and reader.file_size != part.file_size):
            reader.close()
            raise TraceSetError(part.path, "changed since the trace set was opened")
        return reader

    def _retire(self, i: int, reader: TraceReader) -> None:
        """Keep what a reader learnt (unknown tags, a torn tail), then close it."""
        self._unknown.update(reader.unknown_records)
        self.parts[i].clean = reader.closed_cleanly
        if reader.truncated_at is not None:
            self._torn.setdefault(i, reader.truncated_at)
        reader.close()


class _Streaming:
    """Part ``i``'s reader, held out of the cache while one sequential read uses it (so random
    access cannot close it meanwhile), then cached again: each part is opened and checked once."""

    def __init__(self, trace: RankTrace, i: int) -> None:
        self.trace, self.i = trace, i
        self.reader: TraceReader | None = None

    def __enter__(self) -> TraceReader:
        self.reader = self.trace._open.pop(self.i, None) or self.trace._open_part(self.i)
        self.trace._busy.append((self.i, self.reader))
        return self.reader

    def __exit__(self, *exc: object) -> None:
        trace, reader = self.trace, self.reader
        if reader is None:
            return
        trace._busy.remove((self.i, reader))
        if self.i in trace._open:  # another read opened it meanwhile: keep one
            trace._retire(self.i, reader)
            return
        trace._open[self.i] = reader
        while len(trace._open) > OPEN_PARTS:
            trace._retire(*trace._open.popitem(last=False))


@dataclass(frozen=True)
class Run:
    """One server start: its ranks in (pp, dp, tp) order."""

    key: str  # run_id, or host/pid/start for a trace without one
    ranks: tuple[RankTrace, ...]
    notes: tuple[str, ...] = ()  # what is missing but not fatal (leading parts, ranks)

    @property
    def start_wall_ns(self) -> int:
        return min(r.header.start_wall_ns for r in self.ranks)

    @property
    def label(self) -> str:
        return shown(self.key)

    def rank(self, selector: str | None = None) -> RankTrace:
        """The rank named by ``selector`` (a label such as ``tp3``, or a bare tp rank), or the only one."""
        labels = ", ".join(r.label for r in self.ranks)
        if selector is None:
            if len(self.ranks) == 1:
                return self.ranks[0]
            raise TraceSetError(self.ranks[0].path, f"run {self.label} has {len(self.ranks)} ranks ({labels}); "
                                "choose one with --rank")
        matches = [r for r in self.ranks if r.label == selector]
        if not matches and selector.isdigit():
            matches = [r for r in self.ranks if r.key.tp == int(selector)]
        if len(matches) == 1:
            return matches[0]
        what = "matches several ranks" if matches else "names no rank"
        raise TraceSetError(self.ranks[0].path, f"--rank {shown(selector)} {what} of run {self.label} ({labels})")


@dataclass
class TraceSet:
    """Every run found in the files given; close it (or use ``with``) to release the files."""

    files: tuple[Path, ...]
    runs: tuple[Run, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def ranks(self) -> tuple[RankTrace, ...]:
        return tuple(r for run in self.runs for r in run.ranks)

    def run(self, selector: str | None = None) -> Run:
        """The run whose key starts with ``selector``, or the only one."""
        runs = self.runs if selector is None else tuple(r for r in self.runs if r.key.startswith(selector))
        if len(runs) == 1:
            return runs[0]
        listed = "; ".join(f"run {r.label}: {len(r.ranks)} rank(s)" for r in (runs or self.runs)[:8])
        if selector is None:
            message = f"the files hold {len(self.runs)} runs ({listed}); choose one with --run"
        else:
            message = f"--run {shown(selector)} {'matches several runs' if runs else 'names no run'} ({listed})"
        raise TraceSetError(self.files[0], message)

    def rank(self, rank: str | None = None, run: str | None = None) -> RankTrace:
        """One rank's trace, for commands that read one: ``--run`` then ``--rank`` pick it."""
        return self.run(run).rank(rank)

    def close(self) -> None:
        for r in self.ranks:
            r.close()

    def __enter__(self) -> TraceSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_traceset(paths: Iterable[str | os.PathLike], *, max_files: int = MAX_FILES,
                  skip_damaged: bool = False) -> TraceSet:
    """Read the headers of every trace under ``paths`` and group them into runs, ranks and parts.

    ``skip_damaged``: a part whose footer fails its checks opens as one not closed, and its
    readers read on past unreadable regions (``RankTrace.gaps``).
    """
    files = expand_paths(paths, max_files)
    parts = [read_part(f, skip_damaged=skip_damaged) for f in files]
    by_run: dict[str, dict[RankKey, list[TracePart]]] = {}
    for part in parts:
        by_run.setdefault(run_key(part.header), {}).setdefault(rank_key(part.header), []).append(part)
    runs = [_make_run(key, ranks) for key, ranks in by_run.items()]
    runs.sort(key=lambda r: (r.start_wall_ns, r.key))
    return TraceSet(files=tuple(files), runs=tuple(runs), notes=tuple(n for r in runs for n in r.notes))


def source_paths(source: RankTrace | TraceReader | str | os.PathLike) -> tuple[str, ...]:
    """The files to reopen ``source`` from, elsewhere: its parts in order (same global offsets)."""
    if isinstance(source, RankTrace):
        return tuple(str(p.path) for p in source.parts)
    return (source.path if isinstance(source, TraceReader) else str(source),)


def read_part(path: Path, *, skip_damaged: bool = False) -> TracePart:
    """The header and the size facts of one file; the file is closed again."""
    with TraceReader(path, skip_damaged=skip_damaged) as reader:
        has_footer = reader.footer is not None
        count = reader.pass_count if has_footer else None  # a part without one is scanned only if needed
        return TracePart(path=path, header=reader.header, file_size=reader.file_size, has_footer=has_footer,
                         pass_count=count, skip_damaged=skip_damaged)


def _make_run(key: str, ranks: dict[RankKey, list[TracePart]]) -> Run:
    notes: list[str] = []
    traces = []
    for rank in sorted(ranks):
        parts = ordered_parts(key, ranks[rank])
        label = rank_label(parts[0].header)
        if parts[0].header.part > 0:
            notes.append(f"{parts[0].path}: rank {label} of run {shown(key)} starts at part "
                         f"{parts[0].header.part}; the parts before it are not in the set")
        traces.append(RankTrace(label=label, key=rank, parts=parts))
    notes.extend(missing_ranks(key, traces))
    return Run(key=key, ranks=tuple(traces), notes=tuple(notes))
