"""Shared fixtures: real sglang servers on CPU, each started once per test session.

Use them like this::

    from conftest import generate   # pytest puts tests/ on sys.path

    def test_something(sandbox):
        out = generate(sandbox, rid="my-test-1", input_len=3000, max_new_tokens=20)
        assert out["meta_info"]["completion_tokens"] == 20

``sandbox`` is the tiny Llama under KV pressure; ``mamba_sandbox`` and
``swa_sandbox`` are the two hybrid models under their own overload, started
together (in parallel) by ``hybrid_sandboxes``; ``armed_sandbox`` runs a
user's arm live, with a small writer queue.

Tests marked ``@pytest.mark.own_server`` start and stop their own server;
they are moved to the front of the run so that they finish before a shared
server starts. The tests using one shared server run next to each other, and
each shared server stops right after the last test that uses it, so an idle
server never competes with the next one for the 2 cores. A test marked
``@pytest.mark.stops_shared_server`` runs after every other test of its
shared server, so it may stop that server itself (a server dying under load).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from repro_traces import latch_diff
from schedtrace.testing.matrix import MatrixRecording, Recorded
from schedtrace.testing.requests import VOCAB_SIZE, generate, random_input_ids  # noqa: F401 (tests import them from here)
from schedtrace.tracer.contract.names import QUEUE_ENV
from schedtrace.tracer.sandbox.server import KV_PRESSURE_ARGS, SandboxServer

# The tests `schedtrace repro` emitted (tests/repro_emitted/) fail on stock sglang by
# design; tests/test_repro.py runs them in pytest processes of their own, per fix.
collect_ignore_glob = ["repro_emitted/test_*.py"]

# Shared-server fixtures, in the order their tests run (after own_server tests).
SERVER_FIXTURES = ("hybrid_sandboxes", "armed_sandbox", "sandbox")
HYBRID_MODELS = ("hybrid-mamba", "hybrid-swa")
_running: dict[str, Callable[[], None]] = {}  # shared-server fixture -> its stop()
# The policy matrix's servers record in the background, one at a time, from the first test that needs
# no server on (after the shared servers stopped); its own tests run last and wait for them.
MATRIX_FIXTURE = "matrix"
_matrix: list[MatrixRecording] = []



@pytest.fixture(scope="session")
def schedtrace_script() -> Path:
    """The ``schedtrace`` console script the README's commands run (installed beside this interpreter)."""
    return Path(sys.executable).with_name("schedtrace")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "own_server: starts its own sandbox server; runs before the shared one exists"
    )
    config.addinivalue_line(
        "markers", "stops_shared_server: stops its shared server; runs after that server's other tests"
    )


def _run_group(item: pytest.Item) -> int:
    if item.get_closest_marker("own_server") is not None:
        return 0
    if MATRIX_FIXTURE in item.fixturenames:
        return len(SERVER_FIXTURES) + 2
    for rank, name in enumerate(SERVER_FIXTURES, start=1):
        if name in item.fixturenames:
            return rank
    return len(SERVER_FIXTURES) + 1


def _run_order(item: pytest.Item) -> tuple[int, bool]:
    return _run_group(item), item.get_closest_marker("stops_shared_server") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_run_order)  # stable: file order within each group


def pytest_runtest_setup(item: pytest.Item) -> None:
    """From the first test that needs no server on, the matrix records beside the tests."""
    if _matrix or _run_group(item) <= len(SERVER_FIXTURES):
        return
    if any(MATRIX_FIXTURE in later.fixturenames for later in item.session.items):
        _matrix.append(MatrixRecording(item.config._tmp_path_factory.mktemp("matrix")))
        _matrix[0].start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    for recording in _matrix:
        recording.cancel()


@pytest.fixture(scope="session")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Recorded]:
    """Each policy-matrix configuration's recording (schedtrace.testing.matrix.CONFIGS), by name."""
    if not _matrix:
        _matrix.append(MatrixRecording(tmp_path_factory.mktemp("matrix")))
    return _matrix[0].result()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop each shared server once no later test uses it (session teardown would be too late)."""
    if not _running:
        return
    items = item.session.items
    later = items[items.index(nextitem):] if nextitem is not None else []
    for name in list(_running):
        if not any(name in later_item.fixturenames for later_item in later):
            _running.pop(name)()


@contextlib.contextmanager
def shared_servers(name: str, servers: list[SandboxServer]) -> Iterator[list[SandboxServer]]:
    """Start ``servers`` together; stop them after their last test (or at session end)."""

    def stop() -> None:
        for server in servers:
            server.stop()

    try:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(SandboxServer.start, servers))  # the first failure is raised here
        _running[name] = stop
        yield servers
    finally:
        _running.pop(name, None)
        stop()


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxServer]:
    """The real sglang server on CPU, started once per session, stopped after its last test.

    What it is: ``python -m sglang.launch_server`` on the shipped tiny Llama
    (2 layers, vocab 512, dummy weights, fp32, torch_native attention) with
    the KV-pressure arguments ``KV_PRESSURE_ARGS``: ``--max-running-requests
    12 --chunked-prefill-size 8192 --max-total-tokens 40000``. Prompts longer
    than 8192 tokens, or several queued prompts together, are prefilled in
    chunks; about 40k tokens in flight fill the KV pool.

    Tracing is on: the recorder plugin writes ``*.trace`` files into
    ``sandbox.trace_dir`` (a session temp dir shared by every test using this
    fixture, so filter records by your own ``rid``s; give each request a
    unique rid, e.g. prefixed with the test name). No live fixes are applied
    (no ``SCHEDTRACE_FIXES``).

    Attributes: ``url`` (``http://127.0.0.1:PORT``), ``port``, ``trace_dir``,
    ``log_path`` (server stdout+stderr; the scheduler logs "Prefill batch" /
    "Decode batch" lines there), ``pid`` (the launcher, which leads the
    server's process group).

    Send requests with ``generate(sandbox, rid, input_len, max_new_tokens)``.
    Do not stop or restart it; tests that need another configuration start
    their own ``SandboxServer`` and mark themselves ``own_server``.
    """
    base = tmp_path_factory.mktemp("sandbox")
    server = SandboxServer(
        trace_dir=base / "traces",
        extra_args=KV_PRESSURE_ARGS,
        log_path=base / "server.log",
    )
    with shared_servers("sandbox", [server]):
        yield server


WRITER_QUEUE = 16  # armed_sandbox's writer queue: what a kill -9 can take is few records, and bounded


@dataclass(frozen=True)
class ArmedSandbox:
    server: SandboxServer
    diff: Path  # the user's arm it runs: the latch fix as a diff that logs LIVE_MARKER


@pytest.fixture(scope="session")
def armed_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArmedSandbox]:
    """The tiny Llama at its default arguments with a user's arm applied live (``SCHEDTRACE_FIXES``
    naming a diff file), recording with a small writer queue (``SCHEDTRACE_QUEUE``). The live arm
    test reads its log; the kill -9 test, marked ``stops_shared_server``, kills its scheduler last."""
    base = tmp_path_factory.mktemp("armed")
    diff = latch_diff(base / "latch-live.diff", marker=True)
    server = SandboxServer(fixes=str(diff), trace_dir=base / "traces", log_path=base / "server.log",
                           env={QUEUE_ENV: str(WRITER_QUEUE)})
    with shared_servers("armed_sandbox", [server]):
        yield ArmedSandbox(server, diff)


@pytest.fixture(scope="session")
def hybrid_sandboxes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SandboxServer]]:
    """The two hybrid sandboxes, started in parallel, by model name, recording traces.

    ``"hybrid-mamba"``: tiny Kimi-Linear (KDA + MLA), real forward, a mamba state
    pool of 24 slots (8 running requests at most), 1k chunks, a 16k-token KV pool.
    ``"hybrid-swa"``: tiny gpt-oss (sliding window), forward stood in for
    (deterministic tokens, EOS after a request-dependent number of steps),
    8 running requests, 1k chunks, a 16k-token full pool. Both: the models'
    ``overload_args``. Attributes as for ``sandbox``; filter traces by rid.
    """
    base = tmp_path_factory.mktemp("hybrid")
    servers = [
        SandboxServer(model=name, overload=True, trace_dir=base / name / "traces",
                      log_path=base / name / "server.log")
        for name in HYBRID_MODELS
    ]
    with shared_servers("hybrid_sandboxes", servers):
        yield {server.model.name: server for server in servers}


@pytest.fixture(scope="session")
def mamba_sandbox(hybrid_sandboxes: dict[str, SandboxServer]) -> SandboxServer:
    return hybrid_sandboxes["hybrid-mamba"]


@pytest.fixture(scope="session")
def swa_sandbox(hybrid_sandboxes: dict[str, SandboxServer]) -> SandboxServer:
    return hybrid_sandboxes["hybrid-swa"]


def log_size(path: Path) -> int:
    """Current size of a log file, to read only what a test caused afterwards."""
    return path.stat().st_size if path.exists() else 0
