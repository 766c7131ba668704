"""Drive a sandbox server with sglang's own benchmark client.

The load is the real ``sglang.bench_serving`` client (its current module path
is ``sglang.benchmark.serving``) with the ``random-ids`` dataset, which needs
no download: prompts are random token ids from the shipped tiny tokenizer,
sent as ``input_ids`` (``--tokenize-prompt``). The run is bounded: a fixed
number of prompts and a wall-clock limit after which the client's whole
process group is killed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from schedtrace.tracer.contract.errors import SandboxError
from schedtrace.tracer.sandbox.process import read_log_tail, stop_process_group
from schedtrace.tracer.sandbox.server import MODEL_DIR, server_env

BENCH_MODULE = "sglang.benchmark.serving"  # ``sglang.bench_serving`` is its deprecated alias


@dataclass(frozen=True)
class LoadSpec:
    """How much load to send; the defaults are the demo's CPU-sized overload."""

    num_prompts: int = 96
    max_concurrency: int = 48
    input_len: int = 3000
    output_len: int = 300
    range_ratio: float = 0.5  # lengths drawn from [len * (1 - ratio), len * (1 + ratio)]
    seed: int = 1
    timeout_s: float = 900.0  # ~2 min alone on 2 cores; much more when the cores are shared


@dataclass(frozen=True)
class LoadResult:
    """The figures bench_serving wrote to its ``--output-file``."""

    num_prompts: int
    completed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    input_throughput: float
    output_throughput: float
    mean_ttft_ms: float
    median_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    mean_e2e_latency_ms: float
    raw: dict = field(repr=False, compare=False)

    @property
    def failed(self) -> int:
        return self.num_prompts - self.completed

    def summary(self) -> str:
        return (
            f"{self.completed}/{self.num_prompts} completed, {self.failed} failed in "
            f"{self.duration_s:.1f}s; {self.request_throughput:.2f} req/s, "
            f"{self.input_throughput:.0f} in tok/s, {self.output_throughput:.0f} out tok/s; "
            f"TTFT mean {self.mean_ttft_ms:.0f} ms, p99 {self.p99_ttft_ms:.0f} ms"
        )


def bench_command(url: str, spec: LoadSpec, output_file: Path, tokenizer_dir: Path = MODEL_DIR) -> list[str]:
    return [
        sys.executable, "-m", BENCH_MODULE,
        "--backend", "sglang",
        "--base-url", url,
        "--dataset-name", "random-ids",
        "--tokenize-prompt",
        "--tokenizer", str(tokenizer_dir),
        "--num-prompts", str(spec.num_prompts),
        "--max-concurrency", str(spec.max_concurrency),
        "--random-input-len", str(spec.input_len),
        "--random-output-len", str(spec.output_len),
        "--random-range-ratio", str(spec.range_ratio),
        "--seed", str(spec.seed),
        "--output-file", str(output_file),
        "--disable-tqdm",
    ]


def parse_result(output_file: Path, num_prompts: int) -> LoadResult:
    """The last JSON line bench_serving appended to ``output_file``."""
    try:
        lines = [ln for ln in output_file.read_text(encoding="utf-8").splitlines() if ln.strip()]
        raw = json.loads(lines[-1])
    except (OSError, IndexError, json.JSONDecodeError) as exc:
        raise SandboxError(f"{output_file}: no bench_serving result ({exc})") from None
    return LoadResult(
        num_prompts=num_prompts,
        completed=int(raw.get("completed") or 0),
        duration_s=float(raw.get("duration") or 0.0),
        total_input_tokens=int(raw.get("total_input_tokens") or 0),
        total_output_tokens=int(raw.get("total_output_tokens") or 0),
        request_throughput=float(raw.get("request_throughput") or 0.0),
        input_throughput=float(raw.get("input_throughput") or 0.0),
        output_throughput=float(raw.get("output_throughput") or 0.0),
        mean_ttft_ms=float(raw.get("mean_ttft_ms") or 0.0),
        median_ttft_ms=float(raw.get("median_ttft_ms") or 0.0),
        p99_ttft_ms=float(raw.get("p99_ttft_ms") or 0.0),
        mean_tpot_ms=float(raw.get("mean_tpot_ms") or 0.0),
        mean_e2e_latency_ms=float(raw.get("mean_e2e_latency_ms") or 0.0),
        raw=raw,
    )


def run_load(
    url: str,
    spec: LoadSpec = LoadSpec(),
    work_dir: str | os.PathLike[str] | None = None,
    tokenizer_dir: Path = MODEL_DIR,
) -> LoadResult:
    """Run bench_serving against ``url``; its log and result JSON go to ``work_dir``.

    ``tokenizer_dir``: the served model's folder (``SandboxServer.model_dir``);
    every sandbox model ships the same tiny tokenizer.

    Raises ``SandboxError`` (quoting the client's log tail) if the client
    fails, writes no result, or runs past ``spec.timeout_s``.
    """
    out = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="schedtrace-load-"))
    out.mkdir(parents=True, exist_ok=True)
    output_file = out / "bench_serving.jsonl"
    log_path = out / "bench_serving.log"
    output_file.unlink(missing_ok=True)
    # Same environment as the server (kernel stand-in, CPU engine), no tracing.
    env = server_env(os.environ, trace_dir=None, fixes=None)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            bench_command(url, spec, output_file, tokenizer_dir),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    deadline = time.monotonic() + spec.timeout_s
    try:
        while proc.poll() is None:
            if time.monotonic() >= deadline:
                raise SandboxError(
                    f"bench_serving ran past {spec.timeout_s:.0f}s; log {log_path}:\n"
                    + read_log_tail(log_path, 30)
                )
            time.sleep(0.5)
    finally:
        stop_process_group(proc, graceful_s=2.0, grace_s=5.0)
    if proc.returncode != 0:
        raise SandboxError(f"bench_serving exited with code {proc.returncode}; log {log_path}:\n" + read_log_tail(log_path, 30))
    return parse_result(output_file, spec.num_prompts)
