"""Synthetic, deterministic traces (and a matching replay report) for tests and benches.

``python -m bench.gen_trace OUT.trace --passes N`` writes one from the shell.

A tiny queueing model stands in for the scheduler: requests arrive, wait,
are admitted while KV and slots allow (long prompts in chunks), decode and
finish. Planted on purpose, at deterministic passes:

* stall windows where ``batch_is_full`` stays latched and nothing is admitted
  (the report marks each such pass as a ``batch_is_full`` divergence fixed by
  ``latch`` and lists the window as an old-arm stall);
* failed ``alloc_extend`` calls, each followed by an ``over_ask`` divergence;
* one pass that raised (an ``error`` divergence and an old-arm error).

The same seed and sizes always give the same bytes. Records carry lengths and
rids only, like real traces.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from schedtrace.tracer.contract.report import (
    DIVERGENCE_KINDS,
    ArmError,
    Decision,
    Divergence,
    Fidelity,
    Report,
    Stall,
    dump_report,
)
from schedtrace.testing import builders
from schedtrace.tracer.contract.format import TraceWriter
from schedtrace.tracer.contract.schema import (
    Admitted,
    Alloc,
    Arrival,
    Candidate,
    ChunkedReq,
    ChunkOutcome,
    Finish,
    Header,
    KvSnapshot,
    Pass,
    RunningReq,
    WaitingReq,
)

CHUNK = 2048
MAX_RUNNING = 12
KV_TOTAL = 40_000
STALL_EVERY = 5_000  # a stall window starts every this many passes (fewer in short traces) ...
STALL_LEN = 40  # ... and lasts this many
ALLOC_FAIL_EVERY = 3_331  # (fewer in short traces)
ERROR_PASS_FRACTION = 0.61  # the raising pass sits at this fraction of the trace
PASS_NS = 2_000_000
BACKLOG = 40  # arrivals stop while this many requests wait


def make_header(seed: int = 0) -> Header:
    return builders.header(
        host="synthetic",
        pid=1000 + seed,
        start_wall_ns=1_700_000_000_000_000_000,
        server_args=builders.server_args(
            chunked_prefill_size=CHUNK, max_running_requests=MAX_RUNNING, max_total_tokens=KV_TOTAL,
        ),
        max_req_slots=MAX_RUNNING + 4,
    )


@dataclass
class _Req:
    rid: str
    input_len: int
    max_new_tokens: int
    prefilled: int = 0
    output_len: int = 0
    waiting_row: WaitingReq | None = None

    def waiting(self) -> WaitingReq:
        # Reused while unchanged: encoding the same row object is free of allocation.
        if self.waiting_row is None or self.waiting_row.prefix_len != self.prefilled:
            self.waiting_row = WaitingReq(
                rid=self.rid,
                input_len=self.input_len,
                output_len=0,
                max_new_tokens=self.max_new_tokens,
                prefix_len=self.prefilled,
            )
        return self.waiting_row


@dataclass
class _Sim:
    rng: random.Random
    n_passes: int
    stall_every: int = STALL_EVERY
    alloc_fail_every: int = ALLOC_FAIL_EVERY
    backlog: int = BACKLOG
    rid_digits: int = 7
    waiting: deque[_Req] = field(default_factory=deque)
    running: list[_Req] = field(default_factory=list)
    chunked: _Req | None = None
    kv_used: int = 0
    evictable: int = 0
    next_rid: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)
    errors: list[ArmError] = field(default_factory=list)

    def arrivals(self, t_ns: int) -> list[Arrival]:
        out = []
        # Arrival rate a little above service rate, so queues build up and drain.
        while self.rng.random() < 0.35 and len(self.waiting) < self.backlog:
            out.append(self.arrive(t_ns))
        return out

    def arrive(self, t_ns: int) -> Arrival:
        req = _Req(
            rid=f"r{self.next_rid:0{self.rid_digits}d}",
            input_len=self.rng.randint(200, 5000),
            max_new_tokens=self.rng.randint(20, 120),
        )
        self.next_rid += 1
        self.waiting.append(req)
        return Arrival(t_ns=t_ns, rid=req.rid, input_len=req.input_len, max_new_tokens=req.max_new_tokens)

    def free(self) -> int:
        return KV_TOTAL - self.kv_used - self.evictable

    def step(self, seq: int, t_ns: int) -> list:
        records: list = self.arrivals(t_ns - PASS_NS // 2)
        in_stall = seq % self.stall_every >= self.stall_every - STALL_LEN
        waiting_rows = [r.waiting() for r in self.waiting]
        running_rows = [
            RunningReq(rid=r.rid, input_len=r.input_len, output_len=r.output_len, max_new_tokens=r.max_new_tokens)
            for r in self.running
        ]
        chunked = self.chunked
        chunked_row = (
            ChunkedReq(rid=chunked.rid, input_len=chunked.input_len, prefix_len=chunked.prefilled,
                       max_new_tokens=chunked.max_new_tokens)
            if chunked else None
        )
        kv = KvSnapshot(available=self.free(), evictable=self.evictable)
        candidates: list[Candidate] = []
        admitted: list[Admitted] = []
        chunk_outcome = None
        new_chunked = None
        error = None
        budget = CHUNK
        batch_full_in = in_stall

        if seq == int(self.n_passes * ERROR_PASS_FRACTION):
            error = "AssertionError: a second unfinished chunked request was admitted"
        if not in_stall and error is None:
            if chunked is not None:
                size = min(CHUNK, chunked.input_len - chunked.prefilled, max(self.free() + self.evictable, 0))
                chunk_outcome = ChunkOutcome(rid=chunked.rid, budget=CHUNK, size=size or None)
                self._take(size)
                chunked.prefilled += size
                budget -= size
                if chunked.prefilled >= chunked.input_len:
                    self.running.append(chunked)
                    self.chunked = None
            while self.waiting and budget > 0 and len(self.running) < MAX_RUNNING and self.chunked is None:
                req = self.waiting[0]
                need = req.input_len - req.prefilled
                if need + req.max_new_tokens > self.free() + self.evictable:
                    candidates.append(Candidate(rid=req.rid, prefix_len=req.prefilled, extend_len=0, result="NO_TOKEN"))
                    break
                extend = min(need, budget)
                candidates.append(Candidate(rid=req.rid, prefix_len=req.prefilled, extend_len=extend, result="CONTINUE"))
                admitted.append(Admitted(rid=req.rid, prefix_len=req.prefilled, extend_len=extend))
                self.waiting.popleft()
                self._take(extend)
                req.prefilled += extend
                budget -= extend
                if req.prefilled < req.input_len:
                    self.chunked = new_chunked = req
                else:
                    self.running.append(req)

        records.append(
            Pass(
                seq=seq, t_ns=t_ns, dur_ns=150_000 + 20_000 * len(candidates), repeat=1, idle_before=0,
                waiting=waiting_rows, running=running_rows, chunked=chunked_row, batch_is_full_in=batch_full_in,
                kv=kv, req_slots_free=MAX_RUNNING + 4 - len(self.running), new_token_ratio=0.4,
                chunked_prefill_size=CHUNK, candidates=candidates, admitted=admitted, chunk=chunk_outcome,
                new_chunked_rid=new_chunked.rid if new_chunked else None, batch_is_full_out=batch_full_in,
                error=error,
            )
        )
        self._plant(seq, t_ns, in_stall, waiting_rows, error, records)
        records.extend(self.decode(t_ns + PASS_NS // 2))
        return records

    def _take(self, tokens: int) -> None:
        if tokens > self.free():
            reclaimed = min(self.evictable, tokens - self.free())
            self.evictable -= reclaimed
        self.kv_used += tokens

    def _plant(self, seq: int, t_ns: int, in_stall: bool, waiting: list[WaitingReq], error: str | None,
               records: list) -> None:
        """The planted anomalies and their report entries."""
        if in_stall and waiting:
            head = waiting[0]
            fixed = Decision(admitted=[(head.rid, min(CHUNK, head.input_len))])
            self.divergences.append(
                Divergence(pass_=seq, t_ns=t_ns, kinds=["admitted", "batch_is_full"], fixes=["latch"],
                           old=Decision(admitted=[], batch_is_full=True), new=fixed)
            )
            if seq % self.stall_every == self.stall_every - STALL_LEN:
                self.stalls.append(Stall(start_pass=seq, end_pass=seq + STALL_LEN - 1, passes=STALL_LEN,
                                         head_rid=head.rid))
        if seq % self.alloc_fail_every == self.alloc_fail_every - 1:
            asked = CHUNK
            records.append(Alloc(t_ns=t_ns + 1000, pass_seq=seq, op="alloc_extend", requested=asked,
                                 available=asked // 4, evictable=0, ok=False))
            self.divergences.append(
                Divergence(pass_=seq, t_ns=t_ns, kinds=["chunk", "over_ask"], fixes=["chunk-cap"],
                           old=Decision(admitted=[], chunk_budget=CHUNK, chunk_size=CHUNK, over_ask=asked - asked // 4),
                           new=Decision(admitted=[], chunk_budget=asked // 4, chunk_size=asked // 4))
            )
        if error is not None:
            self.errors.append(ArmError(pass_=seq, error=error))
            self.divergences.append(
                Divergence(pass_=seq, t_ns=t_ns, kinds=["error"], fixes=["one-chunk"],
                           old=Decision(admitted=[], error=error), new=Decision(admitted=[]))
            )

    def decode(self, t_ns: int) -> list[Finish]:
        finished = []
        still = []
        for req in self.running:
            req.output_len += 4
            self.kv_used += 4
            if req.output_len >= req.max_new_tokens:
                finished.append(Finish(t_ns=t_ns, rid=req.rid, output_len=req.output_len, reason="length"))
                held = req.input_len + req.output_len
                self.kv_used -= held
                self.evictable += held // 2  # half stays cached in the radix tree
            else:
                still.append(req)
        self.running = still
        self.evictable = min(self.evictable, KV_TOTAL - self.kv_used)
        return finished


def _merge_by_pass(divergences: list[Divergence]) -> list[Divergence]:
    """One divergence per pass: planted anomalies that land on the same pass are merged."""
    merged: dict[int, Divergence] = {}
    for d in divergences:
        first = merged.get(d.pass_)
        if first is None:
            merged[d.pass_] = d
            continue
        kinds = [k for k in DIVERGENCE_KINDS if k in first.kinds or k in d.kinds]
        fixes = sorted(set(first.fixes) | set(d.fixes))
        merged[d.pass_] = Divergence(pass_=d.pass_, t_ns=d.t_ns, kinds=kinds, fixes=fixes, old=first.old, new=first.new)
    return [merged[n] for n in sorted(merged)]


def generate(path: str | Path, passes: int, *, seed: int = 7, report_path: str | Path | None = None,
             cut_bytes: int | None = None, backlog: int | None = None, version: int | None = None,
             rid_digits: int = 7) -> Report:
    """Write ``passes`` passes to ``path``; return (and optionally write) the matching report.

    ``cut_bytes``: instead of closing cleanly, cut that many bytes off the
    end, as a recorder killed mid-write leaves the file. ``backlog``: start
    with this many requests waiting and keep the queue near it (default: it
    starts empty and stays under ``BACKLOG``). ``version``: the format to write
    (``TraceWriter``'s default: the newest). ``rid_digits``: rids are ``r`` and
    this many digits (31: as long as sglang's 32-hex-digit rids).
    """
    sim = _Sim(rng=random.Random(seed), n_passes=passes, stall_every=max(120, min(STALL_EVERY, passes // 4)),
               alloc_fail_every=max(61, min(ALLOC_FAIL_EVERY, passes // 6)), backlog=backlog or BACKLOG,
               rid_digits=rid_digits)
    writer = TraceWriter(path, make_header(seed), version=version)
    batch: list = [sim.arrive(0) for _ in range(backlog or 0)]
    t_ns = 0
    for seq in range(passes):
        t_ns += PASS_NS
        batch.extend(sim.step(seq, t_ns))
        if len(batch) > 4096:
            writer.write_many(batch)
            batch.clear()
    writer.write_many(batch)
    if cut_bytes is None:
        writer.close(t_ns + PASS_NS)
    else:
        writer.abandon()
        with open(path, "r+b") as file:
            file.truncate(max(writer.size - cut_bytes, 0))
    divergences = _merge_by_pass(sim.divergences)
    report = Report(
        trace=str(path), sglang_version="0.5.23", trace_sglang_version="0.5.23", old="stock", new="fixed",
        passes=passes, fidelity=Fidelity(arm="stock", matched=passes, total=passes),
        divergences=divergences, stalls={"stock": sim.stalls, "fixed": []},
        errors={"stock": sim.errors, "fixed": []},
    )
    if report_path is not None:
        Path(report_path).write_bytes(dump_report(report))
    return report
