"""schedtrace repro: a divergence or a stall becomes a small test that fails on stock sglang.

The emitted tests are checked in (tests/repro_emitted/); here they are
rebuilt and compared byte for byte, and run in pytest processes of their
own on stock and under each fix: each must fail on stock and pass with its
own fix only. Everything runs the real sglang 0.5.23 code on CPU.

``SCHEDTRACE_UPDATE_EMITTED=1 pytest tests/test_repro.py -k current`` rewrites the
checked-in modules (the run test then verifies them).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from schedtrace.cli import PROG, run
from schedtrace.replay.driver import PassDriver
from schedtrace.arms.fixes import FIX_NAMES
from schedtrace.replay.repro.ddmin import ddmin, round_values_below, shrink_int
from schedtrace.replay.repro.pipeline import Verdict, build
from schedtrace.replay.repro.probe import Oracle, Probe
from schedtrace.replay.repro.shrink import shrink_pass
from schedtrace.replay.repro.forkserver import ForkServer
from schedtrace.replay.repro.verify import FAILED, PASSED, Run, run_pytest, run_variants
from schedtrace.testing import builders
from schedtrace.tracer.contract.format import TraceReader, write_trace
from schedtrace.tracer.contract.names import FIXES_ENV, STOCK
from schedtrace.tracer.contract.schema import Header, KvSnapshot, RunningReq, WaitingReq

from loop_traces import latch_reproduction
from repro_traces import aiter_trace, chunk_cap_trace, latch_trace, one_chunk_trace

REPO = Path(__file__).resolve().parent.parent
EMITTED = Path(__file__).resolve().parent / "repro_emitted"
SAMPLE = "traces/kv-pressure-lpm-24k.trace"  # its one divergence: pass 867, latch (traces/README.md)
UPDATE = os.environ.get("SCHEDTRACE_UPDATE_EMITTED") == "1"



def cached_prefix_trace(path: Path) -> Path:
    """A latched batch; the queued request's prompt is cached (shared with a running one), so only
    its last tokens need KV: the latch fix admits it into the little KV that is free."""
    p = builders.pass_record(
        0,
        waiting=[WaitingReq("cached", 3000, 0, 10, 2900, None, True)],
        running=[RunningReq("sharer", 2900, 20, 30, True)],
        batch_is_full_in=True,
        kv=KvSnapshot(available=150, evictable=0),
        req_slots_free=8,
        batch_is_full_out=True,
    )
    return write_trace(path, builders.header(), [p])


# checked-in module -> (trace builder, the trace's name, the pass, the fix it is for)
BUILT: dict[str, tuple[Callable[[Path], Path], str, int, str]] = {
    "test_chunk_cap_pass0.py": (chunk_cap_trace, "chunk-cap.trace", 0, "chunk-cap"),
    "test_one_chunk_pass0.py": (one_chunk_trace, "one-chunk.trace", 0, "one-chunk"),
    "test_latch_pass0.py": (latch_trace, "latch.trace", 0, "latch"),
    "test_aiter_pass0.py": (aiter_trace, "aiter.trace", 0, "aiter"),
    "test_cached_prefix_pass0.py": (cached_prefix_trace, "cached-prefix.trace", 0, "latch"),  # the prefix cache
}
SAMPLE_MODULE = "test_kv_pressure_lpm_24k_pass867.py"
STALL_MODULE = "test_loop_latch_stall0.py"
OWN_FIX = {**{name: fix for name, (_, _, _, fix) in BUILT.items()}, SAMPLE_MODULE: "latch", STALL_MODULE: "latch"}


def check_or_update(emitted: Path, text: str | bytes) -> None:
    if UPDATE:
        emitted.write_bytes(text.encode() if isinstance(text, str) else text)
    current = emitted.read_text() if isinstance(text, str) else emitted.read_bytes()
    assert current == text, f"{emitted.name} is not what repro writes now (SCHEDTRACE_UPDATE_EMITTED=1 rewrites it)"


# ------------------------------------------------------------------ ddmin


def test_ddmin_finds_the_one_minimal_core_of_a_list():
    calls: list[list[int]] = []

    def holds(items: list[int]) -> bool:
        calls.append(items)
        return {3, 17} <= set(items)

    assert ddmin(list(range(24)), holds) == [3, 17]
    first = list(calls)
    calls.clear()
    assert ddmin(list(range(24)), holds) == [3, 17]
    assert calls == first  # deterministic: the same questions in the same order
    assert ddmin([5], lambda items: 5 in items) == [5]
    assert ddmin([1, 2, 3], lambda items: True) == []


def test_ddmin_result_is_one_minimal():
    """Removing any one kept item breaks the predicate (here: at least 3 even numbers)."""
    holds = lambda items: sum(1 for x in items if x % 2 == 0) >= 3  # noqa: E731
    kept = ddmin(list(range(20)), holds)
    assert holds(kept) and len(kept) == 3
    assert all(not holds([x for x in kept if x != y]) for y in kept)


def test_shrink_int_prefers_small_round_values():
    assert round_values_below(35) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20, 30]
    assert shrink_int(2980, lambda v: v >= 4) == 4
    assert shrink_int(2980, lambda v: v >= 1234) == 2000  # the smallest round value that holds
    assert shrink_int(2980, lambda v: v >= 2345) == 2400  # none below 2980 does: bisected, rounded up
    assert shrink_int(315, lambda v: v == 315) == 315
    assert shrink_int(0, lambda v: True) == 0


# ------------------------------------------------------- shrinking a pass


def _one_core_state():
    """A latched batch with one running request, one admissible waiting request and decoys.

    The latch fix admits ``core`` (stock admits nothing). Each decoy's decode
    reservation is larger than the whole KV pool, so alone it is refused under
    both arms; and an empty running batch would clear the latch on stock too.
    The only minimal core is therefore {core} waiting, {run} running.
    """
    decoys = [WaitingReq(f"decoy-{k}", 100, 0, 1_000_000, 0, None, True) for k in range(5)]
    header = builders.header()
    p = builders.pass_record(
        0,
        waiting=[WaitingReq("core", 3000, 0, 300, 0, None, True), *decoys],
        running=[RunningReq("run", 2000, 50, 300, True)],
        batch_is_full_in=True,
        kv=KvSnapshot(available=20000, evictable=500),
        req_slots_free=8,
    )
    return header, p


def test_shrinker_finds_the_one_minimal_core_with_the_real_code():
    header, p = _one_core_state()
    oracle = Oracle(PassDriver(header))
    probe = Probe(oracle, "latch", frozenset({"admitted"}))
    assert probe.holds(p)
    kept = ddmin(p.waiting, lambda ws: probe.holds(msgspec.structs.replace(p, waiting=ws)))
    assert [w.rid for w in kept] == ["core"]
    assert not probe.holds(msgspec.structs.replace(p, running=[]))  # the running request is needed

    runs = []
    for _ in range(2):  # deterministic: the same result from the same real-code calls
        fresh = Oracle(PassDriver(header))
        runs.append((shrink_pass(p, Probe(fresh, "latch", frozenset({"admitted"})).holds), fresh.calls))
    assert runs[0] == runs[1]
    shrunk = runs[0][0]
    assert (len(shrunk.waiting), len(shrunk.running)) == (1, 1)
    assert probe.holds(shrunk)
    assert shrunk.waiting[0].input_len < 3000 and shrunk.kv.available < 20000  # the numbers shrank too


# --------------------------------------------------- emitted modules, as built


@pytest.mark.parametrize("module", sorted(BUILT))
def test_emitted_module_is_current(module, tmp_path, monkeypatch):
    make, name, pass_n, fix = BUILT[module]
    monkeypatch.chdir(tmp_path)  # the docstring names the trace as given: keep it short and stable
    make(Path(name))
    repro = build(name, pass_n)
    assert [c.divergent.fixes for c in repro.cases] == [fix]
    assert "schedtrace" not in repro.text.split('"""', 2)[2]  # stands alone: no schedtrace import
    check_or_update(EMITTED / module, repro.text)


def test_repro_command_writes_the_sample_divergence_test(tmp_path, capsys, monkeypatch):
    """The whole command on a recorded trace: shrink, emit, verify in pytest processes, write."""
    monkeypatch.chdir(REPO)
    out = tmp_path / SAMPLE_MODULE
    assert run(["repro", SAMPLE, "--pass", "867", "-o", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "24 waiting, 8 running → 1 waiting, 1 running" in shown
    assert "fails on base, passes with the fix: latch" in shown
    rows = {line.split()[0]: line.split()[1] for line in shown.splitlines() if line.split()[:1] in
            [[v] for v in (STOCK, *FIX_NAMES)]}
    assert rows == {STOCK: FAILED, "chunk-cap": FAILED, "one-chunk": FAILED, "latch": PASSED, "aiter": FAILED}
    check_or_update(EMITTED / SAMPLE_MODULE, out.read_text())


def test_repro_stall_writes_a_minimal_trace_and_its_closed_loop_test(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    latch_reproduction(Path("loop-latch.trace"))
    out = tmp_path / STALL_MODULE
    assert run(["repro", "loop-latch.trace", "--stall", "0", "-o", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "fails on base, passes with the fix: latch" in shown
    assert "6 requests, 10 passes → " in shown
    text = out.read_text()
    assert "from schedtrace.replay.loop.run import run_closed_loop" in text  # it says it imports schedtrace
    check_or_update(EMITTED / STALL_MODULE, text)
    written, checked_in = out.with_suffix(".trace"), EMITTED / Path(STALL_MODULE).with_suffix(".trace").name
    if UPDATE:
        checked_in.write_bytes(written.read_bytes())
    assert records_of(checked_in) == records_of(written), f"{checked_in.name} is not what repro writes now"


def records_of(trace: Path) -> list:
    """The header and records of a trace: its content, whatever the writer's framing and schema version."""
    with TraceReader(trace) as reader:
        header = msgspec.structs.replace(reader.header, schema_version=0)
        return [header, *(record for _, record in reader.records() if not isinstance(record, Header))]


def test_checked_in_modules_fail_on_stock_and_pass_with_their_own_fix_only():
    """Every checked-in module, in one pytest process per variant: stock and each fix alone."""
    modules = sorted(EMITTED.glob("test_*.py"))
    assert {m.name for m in modules} == set(OWN_FIX)
    runs = run_variants(modules, [STOCK, *FIX_NAMES], extra_files=sorted(EMITTED.glob("*.trace")))
    table = {(run.variant, m.name): run.module_outcome(m.stem) for run in runs for m in modules}
    expected = {(v, m.name): PASSED if v == OWN_FIX[m.name] else FAILED for v in (STOCK, *FIX_NAMES)
                for m in modules}
    assert table == expected, {(run.variant, name): message for run in runs for name, message in run.messages.items()
                               if table[run.variant, name.partition("::")[0] + ".py"] == "breaks"}


def test_a_run_that_disagrees_with_the_prediction_is_a_problem():
    runs = [Run(STOCK, {"m::t": FAILED}, "AssertionError: admitted []"), Run("latch", {"m::t": FAILED}, "")]
    verdict = Verdict(runs, {STOCK: FAILED, "latch": PASSED}, "latch")
    assert verdict.problems == ["under latch it fails, the replay predicts it passes"]
    assert Verdict(runs[:1], {STOCK: FAILED}, "latch").problems == []


# ------------------------------------------------------------ bad input


def _one_error_line(err: str, *expected: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{PROG}: error: "), err
    for text in expected:
        assert text in lines[0], lines[0]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--pass", "99"], ["--pass 99: the trace has passes 0..9"]),
        (["--pass", "0", "--fix", "chunk-cap"], ["fix 'chunk-cap' does not cause the divergence", "latch"]),
        (["--pass", "0", "--kind", "aiter"], ["no divergence of kind aiter"]),
        ([], ["give exactly one of --pass N and --stall K"]),
        (["--stall", "4"], ["no stock stall starts at pass 4 (onsets: 0)"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, expected, tmp_path, capsys):
    trace = tmp_path / "loop-latch.trace"
    latch_reproduction(trace)
    assert run(["repro", str(trace), *args, "-o", str(tmp_path / "test_x.py")]) == 2
    _one_error_line(capsys.readouterr().err, *expected)
    assert not (tmp_path / "test_x.py").exists()


def test_a_pass_without_divergence_is_one_line_and_exit_2(tmp_path, capsys):
    """The fcfs sample: stock and fixed agree on every pass."""
    out = tmp_path / "test_x.py"
    assert run(["repro", str(REPO / "traces" / "kv-pressure-fcfs.trace"), "--pass", "100", "-o", str(out)]) == 2
    _one_error_line(capsys.readouterr().err, "pass 100: no divergence between stock and fixed")
    assert not out.exists()


# ---------------------------------------------------------- pytest plugin


def test_plugin_is_registered_and_does_nothing_without_the_variable(tmp_path):
    code = (
        "import sys\n"
        "from importlib.metadata import entry_points\n"
        "(ep,) = [e for e in entry_points(group='pytest11') if e.name == 'schedtrace']\n"
        "plugin = ep.load()\n"
        "plugin.pytest_configure(None)\n"
        "print(plugin.pytest_report_header(None), [m for m in sys.modules if m.split('.')[0] == 'sglang'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != FIXES_ENV}
    # Not from the checkout: a stale schedtrace.egg-info there would shadow the installed entry points.
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None []"


def test_plugin_refuses_an_unknown_fix_before_any_test_runs(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    env = {**os.environ, FIXES_ENV: "latch,nope"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert f"{FIXES_ENV}=latch,nope: unknown variant or fix 'nope'" in done.stderr


# ------------------------------------------------------------ fork server


def test_forked_pytest_runs_report_their_exit_output_and_timeout(tmp_path):
    """The fork server's children are real pytest processes: exit codes, output, environment, a kill."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_env.py").write_text(
        "import os, time\n"
        "def test_env():\n    assert os.environ.get('PROBE') == 'one', os.environ.get('PROBE')\n"
        "def test_slow():\n    if os.environ.get('SLOW'):\n        time.sleep(60)\n")
    argv = ["-q", "-p", "no:cacheprovider", "test_env.py"]
    with ForkServer(preload=["pytest"]) as server:  # what these runs need: no sglang
        assert server.start()
        assert server.run(argv, tmp_path, {**os.environ, "PROBE": "one"}, tmp_path / "a.out", 120) == 0
        assert server.run(argv, tmp_path, {**os.environ, "PROBE": "two"}, tmp_path / "b.out", 120) == 1
        assert "AssertionError: two" in (tmp_path / "b.out").read_text()
        assert server.run(argv, tmp_path, {**os.environ, "PROBE": "one", "SLOW": "1"}, tmp_path / "c.out", 3) is None
    # Without the server, the same runs as plain processes (the fallback), with the same outcomes.
    run_ = run_pytest([tmp_path / "test_env.py"], STOCK)
    assert run_.outcomes == {"test_env::test_env": FAILED, "test_env::test_slow": PASSED}
