"""The embedded CPU sandbox: the real sglang server serves chunked prefill under KV pressure;
the model registry, the launch environment and the stand-in machinery behind it. That its
stop ends every process is checked where the shared server stops mid-load (tests/test_redrive.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from conftest import generate, log_size

from schedtrace.testing.matrix import CONFIGS, MatrixRecording, server_for
from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.names import SGLANG_RADIX_FORCE_MISS, START_METHOD_ENV
from schedtrace.tracer.sandbox.assets.make_tiny_model import VOCAB_SIZE, WIDE_VOCAB_SIZE
from schedtrace.tracer.sandbox.models import MODELS, model
from schedtrace.tracer.sandbox.server import THREADS_BIND_ENV, SandboxServer, rank_args, threads_bind
from schedtrace.tracer.sandbox.standins import STAND_INS, STANDINS_ENV, check_names
from schedtrace.tracer.sandbox.standins.import_hooks import after_import, before_import

PREFILL_LINE = re.compile(r"Prefill batch, #new-seq: (\d+), #new-token: (\d+)")
CHUNK = 8192  # --chunked-prefill-size in KV_PRESSURE_ARGS


def test_serves_concurrent_requests_with_chunked_prefill(sandbox):
    log_start = log_size(sandbox.log_path)
    # One prompt longer than a chunk forces chunked prefill; the rest together
    # (~70k tokens) overflow the 40k-token KV pool.
    lengths = [10_000] + [1500 + 125 * i for i in range(23)]
    results: dict[str, dict] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(lengths))

    def one(i: int, input_len: int) -> None:
        rid = f"sandbox-concurrent-{i}"
        try:
            barrier.wait()
            results[rid] = generate(sandbox, rid, input_len, max_new_tokens=8)
        except BaseException as exc:  # surfaced below with its rid
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i, n)) for i, n in enumerate(lengths)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    assert len(results) == len(lengths)
    for i, input_len in enumerate(lengths):
        meta = results[f"sandbox-concurrent-{i}"]["meta_info"]
        assert meta["id"] == f"sandbox-concurrent-{i}"
        assert meta["prompt_tokens"] == input_len
        assert meta["completion_tokens"] == 8

    with open(sandbox.log_path, "rb") as f:
        f.seek(log_start)
        log = f.read().decode("utf-8", "replace")
    prefills = [(int(s), int(t)) for s, t in PREFILL_LINE.findall(log)]
    assert prefills, "the scheduler logged no prefill batch"
    assert max(tokens for _, tokens in prefills) == CHUNK  # a full chunk, never more
    assert max(seqs for seqs, _ in prefills) > 1  # several queued prompts admitted together


# --- the registry, the launch environment, the stand-in machinery (no server) ---


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_ships_its_config_and_the_tokenizer(name: str) -> None:
    entry = model(name)
    config = json.loads((entry.model_dir / "config.json").read_text())
    # the tokenizer's 512 words; the wide-vocab llama's embedding is wider (make_tiny_model.py)
    assert config["vocab_size"] == (WIDE_VOCAB_SIZE if name == "llama-wide-vocab" else VOCAB_SIZE)
    assert config["eos_token_id"] == 2
    for tokenizer_file in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (entry.model_dir / tokenizer_file).is_file()
    assert check_names(entry.stand_ins) == entry.stand_ins
    described = entry.describe()
    assert described.startswith(f"{name}: ") and "the sgl_kernel import" in described
    assert ("Real: model forward" in described) == entry.real_forward


def test_an_unknown_model_or_stand_in_is_a_one_line_usage_error() -> None:
    with pytest.raises(UsageError, match=r"unknown sandbox model 'mamba'; known: llama, hybrid-mamba"):
        model("mamba")
    with pytest.raises(UsageError, match="unknown sandbox stand-in"):
        check_names(["forward", "gpu"])
    with pytest.raises(UsageError, match="multiple of dp"):
        SandboxServer(tp=3, dp=2)
    with pytest.raises(UsageError, match=">= 1"):
        rank_args(0, 1)


def test_ranks_choose_their_flags_stand_ins_and_cores() -> None:
    assert rank_args(1, 1) == ()
    assert rank_args(2, 1) == ("--tp", "2")
    assert rank_args(2, 2) == ("--tp", "2", "--dp", "2", "--enable-dp-attention")
    assert rank_args(1, 1, pp=2) == ("--pp-size", "2")
    assert threads_bind(2, [0, 1]) == "0|1"
    assert threads_bind(2, [0, 1, 2, 3]) == "0-1|2-3"
    assert threads_bind(3, [0, 1]) == "0|1|0"

    llama = model("llama")
    assert llama.stand_ins_for() == ()
    assert llama.stand_ins_for(tp=2) == ("no-pynccl",)
    assert llama.stand_ins_for(tp=2, dp=2) == ("no-pynccl", "forward")
    assert llama.stand_ins_for(pp=2) == ("no-pynccl",)  # stages talk through torch.distributed too
    pp_server = SandboxServer(model="llama-wide-vocab", pp=2)
    assert "--pp-size" in pp_server.command() and pp_server.environment({})[THREADS_BIND_ENV].count("|") == 1
    dp_server = SandboxServer(dp=2)
    assert dp_server.tp == 2 and "--enable-dp-attention" in dp_server.command()
    assert "model forward" not in dp_server.describe().split("Stood in for")[0]
    env = dp_server.environment({"PYTHONPATH": "/elsewhere", "SCHEDTRACE_DIR": "/stale"})
    assert env[STANDINS_ENV] == "no-pynccl,forward"
    assert env[THREADS_BIND_ENV].count("|") == 1
    assert env["PYTHONPATH"].endswith(os.pathsep + "/elsewhere")
    assert "SCHEDTRACE_DIR" not in env  # tracing only when asked for
    assert THREADS_BIND_ENV not in SandboxServer().environment({})
    assert SandboxServer().environment({})["OMP_NUM_THREADS"] == "1"  # one thread, unless told
    assert SandboxServer().environment({"OMP_NUM_THREADS": "2"})["OMP_NUM_THREADS"] == "2"


def test_a_matrix_server_starts_from_the_recordings_environment_not_a_tests_patch(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The matrix records beside the tests: a setting one test patches into ``os.environ`` meanwhile
    stays out of the server it starts (a test's SGLANG_RADIX_FORCE_MISS once made a recording miss
    every prefix: tests/traces/README.md)."""
    recording = MatrixRecording(tmp_path, CONFIGS[:1])
    monkeypatch.setenv(SGLANG_RADIX_FORCE_MISS, "1")
    assert SGLANG_RADIX_FORCE_MISS not in server_for(CONFIGS[0], tmp_path, recording.base_env).environment()
    assert server_for(CONFIGS[0], tmp_path).environment()[SGLANG_RADIX_FORCE_MISS] == "1"  # by default, inherited


def test_overload_and_model_flags_come_before_the_callers(tmp_path: Path) -> None:
    server = SandboxServer(model="hybrid-mamba", overload=True, extra_args=["--max-mamba-cache-size", "30"])
    command = server.command()
    assert command[command.index("--model-path") + 1] == str(model("hybrid-mamba").model_dir)
    sizes = [command[i + 1] for i, arg in enumerate(command) if arg == "--max-mamba-cache-size"]
    assert sizes[-1] == "30"  # argparse keeps the last: the caller wins over model and overload
    assert "--disable-overlap-schedule" in command


def test_import_hooks_run_around_the_named_module_only(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "hooked_mod.py").write_text("import seen\nseen.order.append('module ran')\nVALUE = 1\n")
    (tmp_path / "seen.py").write_text("order = []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import seen

    before_import("hooked_mod", lambda: seen.order.append("before"))
    after_import("hooked_mod", lambda module: seen.order.append(f"after VALUE={module.VALUE}"))
    import hooked_mod  # noqa: F401

    assert seen.order == ["before", "module ran", "after VALUE=1"]
    after_import("hooked_mod", lambda module: seen.order.append("already imported: now"))
    assert seen.order[-1] == "already imported: now"


START_METHOD_PROBE = "import multiprocessing as mp; mp.set_start_method('spawn', force=True); print(mp.get_start_method())"


def test_server_processes_fork_their_children_unless_told_to_spawn() -> None:
    def start_method(environ: dict[str, str]) -> str:
        env = SandboxServer().environment(environ)
        out = subprocess.run([sys.executable, "-c", START_METHOD_PROBE], env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout.strip()

    base = {k: v for k, v in os.environ.items() if k != START_METHOD_ENV}
    assert start_method(base) == "fork"  # sglang asks for spawn; the sandbox forks
    assert start_method(base | {START_METHOD_ENV: "spawn"}) == "spawn"
    plain = subprocess.run([sys.executable, "-c", START_METHOD_PROBE], env=base, capture_output=True, text=True,
                           timeout=120)
    assert plain.stdout.strip() == "spawn"  # outside the sandbox nothing changes
    with pytest.raises(UsageError, match=f"{START_METHOD_ENV}='vfork': expected 'fork' or 'spawn'"):
        SandboxServer().environment(base | {START_METHOD_ENV: "vfork"})


SITE_PROBE = textwrap.dedent("""
    import importlib.util, json, torch
    import flashinfer.quantization  # takes its no-DSL fallback when the DSL is hidden
    import sglang.srt.distributed.parallel_state as ps
    from schedtrace.tracer.kernel_stub import stubbed
    print(json.dumps({
        "cute_dsl_found": importlib.util.find_spec("cutlass") is not None,
        "device_module": torch.get_device_module().__name__,
        "explicit": torch.get_device_module("cpu").__name__,
        "coordinator_patched": getattr(ps.GroupCoordinator.__init__, "_schedtrace_stand_in", False),
        "sgl_kernel_stubbed": stubbed(),
    }))
""")


def probe_site(stand_ins: tuple[str, ...]) -> dict:
    """What a process started with the sandbox's environment and these stand-ins sees."""
    env = SandboxServer().environment(os.environ) | {STANDINS_ENV: ",".join(stand_ins)}
    out = subprocess.run([sys.executable, "-c", SITE_PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_server_process_gets_the_stand_ins_it_is_told_and_no_others() -> None:
    import torch

    plain = probe_site(())
    untouched = torch.get_device_module().__name__  # torch.cuda with this CUDA build, even without a GPU
    assert plain == {"device_module": untouched, "explicit": "torch.cpu", "coordinator_patched": False,
                     "sgl_kernel_stubbed": True, "cute_dsl_found": False}
    armed = probe_site(("device", "no-pynccl"))
    assert armed == {"device_module": "torch.cpu", "explicit": "torch.cpu", "coordinator_patched": True,
                     "sgl_kernel_stubbed": True, "cute_dsl_found": False}
    # The DSL is installed here: outside the sandbox it is found.
    found = subprocess.run([sys.executable, "-c", "import importlib.util; print(importlib.util.find_spec('cutlass'))"],
                           capture_output=True, text=True, timeout=60)
    assert found.stdout.strip() not in ("", "None"), found.stderr
    assert set(STAND_INS) >= {"device", "no-pynccl", "forward", "linear-attn-kernels"}
