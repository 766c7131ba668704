"""The command line's one voice: errors, --json, the stall default, output that fits.

Fast failures run the real console entry in a fresh process, so what is
checked is exactly what a user sees, and whether sglang got imported.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from rich.console import Console

from schedtrace.cli import PROG, run
from schedtrace.cli.group import COMMANDS, cli
from schedtrace.cli.progress import Activity
from schedtrace.cli.style import compact_table, plural
from schedtrace.tracer.analysis.summary import summarize
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES

from loop_traces import LATCH_PASSES, latch_reproduction

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "traces" / "kv-pressure-lpm-24k.trace"  # a recorded overload (traces/README.md)
KIMI = REPO / "traces" / "hybrid-mamba-kimi.trace"  # format v2, framed; mamba state slots, no DP
WIDTH = 80
# Runs `schedtrace ARGS`, then says on a last stdout line whether sglang was imported.
PROBE = (
    "import sys\n"
    "from schedtrace.cli import run\n"
    "status = run(sys.argv[1:])\n"
    "print('sglang imported:', 'sglang' in sys.modules)\n"
    "sys.exit(status)\n"
)


def probe(*args: str, blocked: str | None = None) -> subprocess.CompletedProcess:
    code = PROBE if blocked is None else f"import sys; sys.modules[{blocked!r}] = None\n" + PROBE
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def assert_one_error_line(done: subprocess.CompletedProcess, *expected: str) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{PROG}: error: ")
    for text in expected:
        assert text in lines[0]


def corrupt_copy(trace: Path, folder: Path) -> tuple[Path, int]:
    """A copy of ``trace`` whose second pass record starts with a byte msgpack never uses."""
    with TraceReader(trace) as reader:
        offset = reader.pass_offsets[1]
    data = bytearray(trace.read_bytes())
    data[offset] = 0xC1
    bad = folder / "bad.trace"
    bad.write_bytes(bytes(data))
    return bad, offset


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    return latch_reproduction(tmp_path_factory.mktemp("cli") / "latch.trace")


@pytest.mark.parametrize(
    "args, expected",
    [
        (["replay", "/nonexistent.trace"], ["/nonexistent.trace", "no such file"]),
        (["replay", "{trace}", "--old", "stok"], ["--old", "'stok'", "stock, fixed"]),
        (["bisect", "{trace}", "--new", "x"], ["No such option", "--new", "schedtrace bisect --help"]),
        (["replay", "{dir}"], ["is a directory"]),  # {dir} holds a directory named like a trace
        (["repro", "{trace}", "{trace}"], ["unexpected extra argument"]),  # repro reads one file
        (["replay", "{trace}", "--fail-on", "sometimes"], ["--fail-on", "'sometimes'"]),
        (["replay", "{trace}", "--stall-passes", "0"], ["--stall-passes", "0"]),
        (["info", "{trace}", "--json", "{trace}"], ["--json", "refusing to overwrite"]),
        (["tui", "{trace}", "--old", "fixed,nope"], ["--old", "'nope'"]),
        (["replay", "{trace}", "--json", "{dir}/missing-dir/x.json"], ["--json", "no such directory"]),
        (["bisect", "{trace}", "--json", "{dir}/missing-dir/x.json"], ["--json", "no such directory"]),
        (["nope"], ["No such command 'nope'"]),
    ],
    ids=["missing-file", "bad-arm", "unknown-option", "directory", "extra-argument", "bad-choice",
         "bad-range", "json-onto-trace", "tui-bad-arm", "replay-json-no-folder", "bisect-json-no-folder",
         "unknown-command"],
)
def test_bad_input_fails_fast_in_one_line_without_sglang(trace, tmp_path, args, expected):
    # A directory is a trace set now (its *.trace files): one that is itself a directory is refused.
    (tmp_path / "sub.trace").mkdir()
    args = [a.format(trace=trace, dir=tmp_path) for a in args]
    done = probe(*args)
    assert_one_error_line(done, *expected)
    assert "Traceback" not in done.stderr
    assert done.stdout.splitlines()[-1] == "sglang imported: False"


def test_the_probe_sees_sglang_when_a_command_imports_it(trace, tmp_path):
    """The control for the test above: a header that opens but a record that
    does not decode is found only while replaying, after sglang is imported."""
    bad, offset = corrupt_copy(trace, tmp_path)
    done = probe("bisect", str(bad))
    assert_one_error_line(done, str(bad), f"offset {offset}")
    assert done.stdout.splitlines()[-1] == "sglang imported: True"


def test_a_corrupt_record_is_listed_as_a_hole_not_a_traceback(trace, tmp_path):
    bad, offset = corrupt_copy(trace, tmp_path)
    done = probe("info", str(bad))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "NOT closed cleanly: 1 unreadable region" in done.stdout
    (line,) = [l for l in done.stdout.splitlines() if "bytes unreadable at offset" in l]
    start, end = (int(x) for x in line.split("at offset ")[1].split(",")[0].split("–"))
    assert start <= offset < end  # the region named holds the corrupt record
    assert not line.rstrip().endswith("()")


@pytest.mark.parametrize("module", ["click", "rich", "sglang"])
def test_a_missing_tools_dependency_names_the_extra(trace, module):
    command = "replay" if module == "sglang" else "info"
    done = probe(command, str(trace), blocked=module)
    assert_one_error_line(done, module, "pip install 'schedtrace[tools]'")


def test_no_command_shows_the_help_and_exit_2():
    done = probe()
    assert done.returncode == 2
    assert "Usage: schedtrace" in done.stderr and "replay" in done.stderr


def test_every_stall_threshold_is_one_option_with_one_default():
    for name in ("info", "replay", "bisect", "export"):
        command = cli.get_command(click.Context(cli), name)
        (option,) = [p for p in command.params if p.name == "stall_passes"]
        assert option.opts == ["--stall-passes"], name
        assert option.default == DEFAULT_STALL_PASSES, name
    assert set(COMMANDS) >= {"info", "replay", "bisect", "export"}


def test_info_and_replay_agree_on_stalls_at_their_defaults(trace, capsys):
    """info's old default (100 passes) hid stalls replay's (8) showed: one default now. The latch trace
    stalls for LATCH_PASSES, between the two, and replays faithfully, so both must list that stall.
    (A synthetic trace's planted stalls would not do: its decisions are not sglang's, so replay differs.)"""
    assert DEFAULT_STALL_PASSES <= LATCH_PASSES < 100
    assert run(["info", str(trace), "--json", "-"]) == 0
    info_stalls = json.loads(capsys.readouterr().out)["anomalies"]["stalls_while_kv_free"]
    assert run(["replay", str(trace), "--json", "-"]) == 0
    replay = json.loads(capsys.readouterr().out)
    assert replay["fidelity"]["matched"] == replay["fidelity"]["total"]
    replay_stalls = replay["stalls"]["stock"]
    assert [(s["first_pass"], s["passes"]) for s in info_stalls] == [(0, LATCH_PASSES)]
    assert [(s["start_pass"], s["passes"]) for s in replay_stalls] == [(0, LATCH_PASSES)]


def test_the_stall_rule_is_said_in_the_same_words_everywhere(trace, capsys):
    from schedtrace.tracer.analysis.stalls import STALL_RULE

    def flat(text: str) -> str:
        return " ".join(text.split())

    for name in ("info", "replay", "bisect", "export", "tui", "sweep", "repro"):
        assert run([name, "--help"]) == 0
        assert STALL_RULE in flat(capsys.readouterr().out), name
    assert STALL_RULE in flat("\n".join(info_lines(trace)))
    for doc in ("otel.md", "replay-report.md", "closed-loop.md", "glossary.md"):
        assert STALL_RULE.replace("(sglang's own admission check)", "") in flat((REPO / "docs" / doc).read_text()), doc


def test_min_run_stays_a_hidden_deprecated_alias(trace, capsys):
    assert run(["info", str(trace), "--min-run", "5", "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["anomalies"]["stall_passes"] == 5
    assert "--min-run is deprecated" in captured.err
    assert run(["info", "--help"]) == 0
    assert "--min-run" not in capsys.readouterr().out
    assert run(["info", str(trace), "--min-run", "5", "--stall-passes", "6"]) == 2


def test_json_means_a_path_with_dash_for_stdout_in_every_command(trace, tmp_path, capsys):
    for command in ("info", "replay", "bisect"):
        status = 1 if command == "bisect" else 0  # bisect: the trace has a stall
        out = tmp_path / f"{command}.json"
        assert run([command, str(trace), "--json", str(out)]) == status
        captured = capsys.readouterr()
        assert captured.out.strip() and not captured.out.lstrip().startswith("{")  # the summary
        assert captured.err == ""  # not a terminal: no spinner, no bar
        assert run([command, str(trace), "--json", "-"]) == status
        captured = capsys.readouterr()
        assert json.loads(captured.out) == json.loads(out.read_bytes()), command
        assert not list(tmp_path.glob("*.partial"))


def test_plural():
    assert [plural(n, "stall") for n in (0, 1, 2)] == ["0 stalls", "1 stall", "2 stalls"]
    assert plural(1, "pass") == "1 pass" and plural(3, "pass") == "3 passes"


def render_lines(renderable) -> list[str]:
    console = Console(width=WIDTH, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text().splitlines()


def test_a_compact_table_keeps_rows_on_one_line_at_80_columns():
    table = compact_table(("arm", "done", "left", "stalls", "stalled passes", "over-asks", "exceptions",
                           "queue peak"), shrink=("arm",))
    table.add_row("chunk-cap,one-chunk,latch,aiter", "67", "0", "1", "28", "0", "0", "47")
    lines = render_lines(table)
    assert max(len(line) for line in lines) <= WIDTH
    assert len(lines) == 3  # header, rule, one row
    assert lines[2].split()[1:] == ["67", "0", "1", "28", "0", "0", "47"]


def test_replay_and_closed_loop_summary_fit_80_columns(trace, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert run(["replay", str(trace), "--old", "stock", "--new", "latch,one-chunk", "--closed-loop",
                "--json", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()  # rich's width off a terminal is 80
    assert max(len(line) for line in printed) <= WIDTH
    rows = [line.split() for line in printed if line.startswith(("stock ", "latch,one-chunk "))]
    assert len(rows) == 2 and all(len(row) == 8 for row in rows)  # each arm on one line, nothing cut
    # The self-check's errors are percentages, and a short recorded wait shows its passes too.
    assert "wait error p50 0.0% (0 → 0 passes), p90 0.0% (0 → 0 passes)" in " ".join(printed)


def test_a_wait_error_is_a_percentage_with_the_passes_beside_a_short_wait():
    from schedtrace.cli.replay import SMALL_WAIT, wait_error

    assert wait_error(1 / 3, 3, 4) == "33.3% (3 → 4 passes)"
    assert wait_error(0.05, SMALL_WAIT * 20, SMALL_WAIT * 21) == "5.0%"


@pytest.mark.parametrize("which", ["sample", "latch"])
def test_info_fits_80_columns(trace, which):
    from schedtrace.cli.info import render

    with TraceReader(SAMPLE if which == "sample" else trace) as reader:
        summary = summarize(reader)
    console = Console(width=WIDTH, record=True, file=io.StringIO())
    render(summary, console)
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= WIDTH
    for stall in summary["anomalies"]["stalls_while_kv_free"]:  # each stall row whole, on one line
        row = [str(stall["first_pass"]), str(stall["passes"]), stall["head_rid"], str(stall["kv_free"])]
        assert row in [line.split() for line in lines]
    assert which == "sample" or summary["anomalies"]["stalls_while_kv_free"]


def test_activity_draws_only_on_a_terminal():
    for terminal in (True, False):
        out = io.StringIO()
        with Activity(Console(file=out, force_terminal=terminal, width=WIDTH)) as activity:
            activity.phase("importing sglang")
            activity.passes("replaying")(3, 10)
        assert ("importing sglang" in out.getvalue()) is terminal


def info_lines(trace: Path) -> list[str]:
    from schedtrace.cli.info import render

    with TraceReader(trace, skip_damaged=True) as reader:
        summary = summarize(reader)
    console = Console(width=200, record=True, file=io.StringIO())
    render(summary, console)
    return console.export_text().splitlines()


def test_info_counts_every_lost_record_under_the_holes(tmp_path):
    """The lost-records row counts the records the unreadable regions lost too, not only loss records."""
    damaged = bytearray(KIMI.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # a framed v2 trace: the batch there fails its checksum
    bad = tmp_path / "bad.trace"
    bad.write_bytes(bytes(damaged))
    lines = info_lines(bad)
    (holes,) = [line for line in lines if line.startswith("holes:")]
    lost = int(holes.split()[1].replace(",", ""))
    assert lost > 0
    (row,) = [line.split() for line in lines if line.startswith("lost records")]
    assert row[2] == f"{lost:,}"


def test_info_names_state_slots_and_no_dp_rank_on_the_kimi_sample():
    lines = info_lines(KIMI)
    allocs = [line for line in lines if "mamba_alloc" in line]
    assert allocs and all(" state slot" in line and "token" not in line for line in allocs)
    (where,) = [line for line in lines if line.startswith("host ")]
    assert "tp rank 0, part 0" in where and "dp rank" not in where  # the header's dp_rank is null
    with TraceReader(KIMI) as reader:
        assert reader.header.dp_rank is None


def test_ray_missing_is_one_line_naming_the_extra():
    """Here, not in test_ray.py (skipped without ray): ray is hidden from the import where it is installed."""
    from schedtrace.replay.scale.ray_executor import INSTALL_HINT

    done = probe("replay", str(KIMI), "--ray", blocked="ray")
    assert_one_error_line(done, INSTALL_HINT)
    assert done.stdout.splitlines()[-1] == "sglang imported: False"


def test_address_needs_ray():
    done = probe("replay", str(KIMI), "--address", "127.0.0.1:1")
    assert_one_error_line(done, "--address")


@pytest.mark.parametrize(
    "args, expected",
    [
        (["sandbox", "--model", "nope"], ["--model", "'nope'", "llama"]),
        (["sandbox", "--tp", "3"], ["--tp", "3"]),
        (["sandbox", "--port", "0"], ["--port", "0"]),
        (["sandbox", "--trace-dir", "{file}/traces"], ["{file}/traces", "cannot create the trace directory"]),
        (["demo", "--prompts", "0"], ["--prompts", "0"]),
        (["demo", "--model", "nope"], ["--model", "'nope'"]),
        (["demo", "--dp", "5"], ["--dp", "5"]),
        (["demo", "--out", "{file}/demo"], ["{file}/demo/traces", "cannot create the trace directory"]),
    ],
    ids=["sandbox-model", "sandbox-tp", "sandbox-port", "sandbox-trace-dir", "demo-prompts", "demo-model",
         "demo-dp", "demo-out"],
)
def test_sandbox_and_demo_refuse_a_bad_option_before_any_server_starts(tmp_path, args, expected):
    """`make demo` is the README's first command: a bad option is one line and exit 2, no server."""
    blocker = tmp_path / "a-file"  # a directory cannot be made under a file
    blocker.write_text("")
    done = probe(*(a.format(file=blocker) for a in args))
    assert_one_error_line(done, *(e.format(file=blocker) for e in expected))
    assert "starting sglang" not in done.stderr + done.stdout
    assert done.stdout.splitlines()[-1] == "sglang imported: False"


def test_sandbox_lists_its_models_and_exits_0():
    done = probe("sandbox", "--list-models")
    assert done.returncode == 0, done.stderr
    assert all(name in done.stdout for name in ("llama", "hybrid-mamba", "hybrid-gdn", "hybrid-swa"))


def test_fail_on_stall_trips_on_a_stall_of_the_new_arm_only(trace, capsys):
    """The latch trace stalls under stock for LATCH_PASSES passes; the fixed logic admits at once."""
    assert run(["replay", str(trace), "--fail-on", "stall"]) == 0  # new arm fixed: no stall
    assert "tripped" not in capsys.readouterr().err
    assert run(["replay", str(trace), "--old", "fixed", "--new", "stock", "--fail-on", "stall"]) == 1
    assert "schedtrace: --fail-on stall: tripped" in capsys.readouterr().err
    assert run(["replay", str(trace), "--old", "fixed", "--new", "stock", "--fail-on", "none"]) == 0
