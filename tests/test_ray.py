"""``--ray``: the work as tasks on a real Ray cluster (``ray start --head`` on loopback).

The cluster starts once for the module with two CPUs and stops afterwards
(its own process group only). The driver (this process) connects once, so
every executor and CLI run here shares the cluster's workers, which import
sglang once each.
"""

from __future__ import annotations

import _thread
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import pytest

from schedtrace.arms import variants
from schedtrace.arms.shipped import BUILTIN_DIFF_PATH
from schedtrace.cli import run
from schedtrace.replay.bisect import run_bisect
from schedtrace.tracer.contract.report import dump_bisect
from schedtrace.replay.loop.run import load_input, run_arms
from schedtrace.replay.engine import replay_trace
from schedtrace.replay.scale.executor import LocalExecutor
from schedtrace.replay.scale.sweep import run_sweep, sweep_arm
from schedtrace.replay.scale.set_tasks import replay_ranks
from schedtrace.replay.scale.sweep_grid import apply_config
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import ARM_FILES_ENV, STOCK
from schedtrace.tracer.contract.report import dump_report, dump_sweep
from schedtrace.tracer.contract.traceset import open_traceset

from loop_traces import latch_reproduction
from test_cli_tracesets import split_into_parts

ray = pytest.importorskip("ray", reason="the ray extra is not installed (its absence: test_cli.py, test_ray_missing_*)")
from schedtrace.replay.scale.ray_executor import RayExecutor  # noqa: E402

TRACES = Path(__file__).resolve().parents[1] / "traces"
SHORT = TRACES / "hybrid-mamba-kimi.trace"  # 305 passes
LONGER = TRACES / "kv-pressure-fcfs.trace"  # 1132 passes: two ranges of at least 200
GRID = {"max_running_requests": [8, 16], "chunked_prefill_size": [4096]}
RANGE_PASSES = 200  # min_passes_per_job: the sample traces are short, ranges must still split


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    """A real head node on 127.0.0.1 with 2 CPUs; this process is its driver."""
    port = _free_port()
    head = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", f"--port={port}",
         "--node-ip-address=127.0.0.1", "--num-cpus=2", "--include-dashboard=false",
         f"--object-store-memory={200 << 20}", "--disable-usage-stats"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    address = f"127.0.0.1:{port}"
    driver = None
    try:
        deadline = time.monotonic() + 120
        while head.poll() is None and time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break  # the GCS is up; ray.init waits for the node itself
            time.sleep(0.5)
        driver = RayExecutor(address)  # joins with the token `ray start` saved
        yield address
    finally:
        if driver is not None:
            driver.close()
        # --block: the head stops its raylet, GCS and workers on SIGTERM, but takes about 33 s to;
        # they are all in its process group, so after a grace the group is killed.
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()


@pytest.fixture(scope="module")
def executor(cluster):
    return RayExecutor(cluster)


def _cli(*args: str) -> int:
    return run(list(args))


# ------------------------------------------------------------- same reports


def test_replay_ranges_on_ray_match_one_process(executor):
    local = dump_report(replay_trace(LONGER))
    assert executor.workers == 2
    on_ray = replay_trace(LONGER, executor=executor, min_passes_per_job=RANGE_PASSES)
    assert on_ray.retried_tasks == 0
    assert dump_report(on_ray) == local
    # Bytes through the object store, as for a node that cannot see the file: the same report.
    executor.ship_files = True
    try:
        shipped = replay_trace(LONGER, executor=RayExecutor(), min_passes_per_job=RANGE_PASSES)
    finally:
        executor.ship_files = None
    assert dump_report(shipped) == local


def test_workers_replay_a_user_diff_they_only_received(executor, tmp_path, monkeypatch):
    """A user's arm on Ray: its file is gone and no path is inherited, so the workers have the
    arm's text only (shipped with each task), and decide as this process does."""
    diff = tmp_path / "shipped.diff"
    diff.write_text(BUILTIN_DIFF_PATH.read_text())
    label = variants.canonical_variant(str(diff))
    diff.unlink()
    monkeypatch.delenv(ARM_FILES_ENV, raising=False)
    try:
        with open_traceset([str(SHORT)]) as traces:
            ranks = traces.run(None).ranks
            (on_ray,) = replay_ranks(executor, ranks, STOCK, label, stall_passes=8)
            here = replay_trace(ranks[0], STOCK, label, stall_passes=8)
    finally:
        variants.set_active(frozenset())
    on_ray.retried_tasks = here.retried_tasks
    assert dump_report(on_ray) == dump_report(here)
    assert on_ray.new == label


def test_replay_ships_chunks_only_when_asked(executor):
    from schedtrace.replay.scale.executor import trace_files

    files = trace_files([str(SHORT)])
    assert executor.locate(files).chunks is None  # the probe: every node (this one) sees the file
    shipping = RayExecutor(ship_files=True)
    assert len(shipping.locate(files).chunks[0]) == 1  # 80 kB: one chunk


def test_cli_replay_bisect_sweep_same_bytes(cluster, tmp_path):
    latch = latch_reproduction(tmp_path / "latch.trace")
    runs = {
        "replay": (["replay", str(SHORT), "--closed-loop"], 0),
        "bisect": (["bisect", str(latch)], 1),  # a stall: the fix subsets run as tasks
        "sweep": (["sweep", str(SHORT), "--set", "max_running_requests=8,16"], 0),
    }
    for name, (args, status) in runs.items():
        local, on_ray = tmp_path / f"{name}-local.json", tmp_path / f"{name}-ray.json"
        assert _cli(*args, "--json", str(local), *(["--jobs", "1"] if name != "bisect" else [])) == status
        assert _cli(*args, "--json", str(on_ray), "--ray", "--address", cluster) == status
        assert on_ray.read_bytes() == local.read_bytes(), name


def test_a_set_of_ranks_runs_a_task_per_rank(cluster, tmp_path):
    """Two ranks of three parts each on two Ray CPUs: each rank whole in one task, the same bytes."""
    from schedtrace.replay.scale.set_tasks import replay_ranks
    from schedtrace.tracer.contract.traceset import open_traceset

    latch = latch_reproduction(tmp_path / "latch.trace")
    folder = tmp_path / "ranks"
    for tp in (0, 1):
        split_into_parts(latch, folder, tp=tp, tp_size=2)
    local, on_ray = tmp_path / "local.json", tmp_path / "ray.json"
    assert _cli("replay", str(folder), "--closed-loop", "--jobs", "1", "--json", str(local)) == 0
    assert _cli("replay", str(folder), "--closed-loop", "--ray", "--address", cluster, "--json", str(on_ray)) == 0
    assert on_ray.read_bytes() == local.read_bytes()
    # The parts' bytes through the object store, as for nodes without shared storage.
    with open_traceset([str(folder)]) as traces:
        ranks = traces.run(None).ranks
        shipped = replay_ranks(RayExecutor(ship_files=True), ranks, "stock", "fixed", stall_passes=8)
        assert [dump_report(r) for r in shipped] == [dump_report(replay_trace(r)) for r in ranks]


def test_bisect_fix_subsets_on_ray(executor, tmp_path):
    latch = latch_reproduction(tmp_path / "latch.trace")
    report = run_bisect(latch, executor=executor)
    assert report.open_loop[0].fix_set == ["latch"]
    assert report.open_loop[0].tried == ["aiter", "chunk-cap", "latch"]  # in order, not as they finished
    assert dump_bisect(report) == dump_bisect(run_bisect(latch))


def test_sweep_cells_are_single_closed_loops(executor):
    report = run_sweep(SHORT, GRID, ["stock", "fixed"], executor=executor)
    assert [c.config for c in report.cells] == [
        {"max_running_requests": 8, "chunked_prefill_size": 4096},
        {"max_running_requests": 16, "chunked_prefill_size": 4096},
    ]
    with TraceReader(SHORT) as reader:
        loop = load_input(reader, 0)
    for cell in report.cells:
        runs = run_arms(None, ["stock", "fixed"], loop=apply_config(loop, cell.config))
        assert {arm: sweep_arm(r.outcome) for arm, r in runs.items()} == cell.arms


# ------------------------------------------------------- a worker that dies


def _die_once(marker: str, fn, item):
    """The work, except that the worker running the first task's first attempt dies abruptly."""
    index, work = item
    if index == 0 and not os.path.exists(marker):
        Path(marker).touch()
        os._exit(1)  # as a kill -9 or an OOM kill: no exception, no cleanup
    return fn(work)


class _KillingExecutor(RayExecutor):
    def __init__(self, address: str, marker: Path) -> None:
        super().__init__(address)
        self.marker = str(marker)

    def map(self, fn, items):
        return super().map(functools.partial(_die_once, self.marker, fn), list(enumerate(items)))


@pytest.fixture
def by_value():
    # This module is not importable on the workers: send _die_once by value (Ray's own cloudpickle).
    from ray import cloudpickle

    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    yield
    cloudpickle.unregister_pickle_by_value(module)


def test_worker_killed_mid_sweep_is_retried_nothing_lost(cluster, tmp_path, by_value):
    local = run_sweep(SHORT, GRID, ["stock", "fixed"], executor=LocalExecutor(1))
    killing = _KillingExecutor(cluster, tmp_path / "died")
    report = run_sweep(SHORT, GRID, ["stock", "fixed"], executor=killing)
    assert (tmp_path / "died").exists()  # a worker did die
    assert report.retried_tasks == 1
    assert msgspec.structs.replace(report, retried_tasks=0) == local  # every cell once, none lost
    assert b'"retried_tasks": 1' in dump_sweep(report)


def test_worker_killed_mid_replay_range_is_retried(cluster, tmp_path, by_value):
    local = replay_trace(LONGER)
    report = replay_trace(LONGER, executor=_KillingExecutor(cluster, tmp_path / "died"),
                          min_passes_per_job=RANGE_PASSES)
    assert report.retried_tasks == 1
    assert report.passes == local.passes  # no range lost, none counted twice
    assert dump_report(msgspec.structs.replace(report, retried_tasks=0)) == dump_report(local)


# ---------------------------------------------------------------- Ctrl-C


def _sleep_then_mark(folder: str):
    def task(n: int) -> int:
        Path(folder, f"started-{n}").touch()
        time.sleep(300)
        Path(folder, f"finished-{n}").touch()
        return n
    return task


def _sleeper(item: tuple[str, int]) -> int:
    folder, n = item
    return _sleep_then_mark(folder)(n)


def test_ctrl_c_cancels_every_task(cluster, tmp_path, by_value):
    executor = RayExecutor(cluster)
    total_cpus = ray.cluster_resources()["CPU"]

    def interrupt_once_running() -> None:
        while not list(tmp_path.glob("started-*")):
            time.sleep(0.1)
        _thread.interrupt_main()  # what Ctrl-C does to the driver

    # Python's own SIGINT handler, which interrupt_main needs: a test run started in the
    # background of a shell inherits SIGINT ignored, and then Ctrl-C would do nothing.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt_once_running, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            list(executor.map(_sleeper, [(str(tmp_path), n) for n in range(4)]))
    finally:
        signal.signal(signal.SIGINT, previous)
    # Cancelled tasks give their CPUs back; none of them ever finishes.
    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0) < total_cpus and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray.available_resources().get("CPU", 0) == total_cpus
    assert not list(tmp_path.glob("finished-*"))
