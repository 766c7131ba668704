"""Run an emitted test in fresh pytest processes: once on stock, once per fix.

Each run copies the module (and any files it reads) into an empty folder
with an empty ``pytest.ini``, so no conftest or project configuration of
the place it came from takes part: the module stands alone, as it will in
sglang's tree. ``SCHEDTRACE_FIXES`` selects the variant (a user arm's file is copied beside the
module and named ``./FILE``, as its user would run it); schedtrace's pytest
plugin (``schedtrace.replay.pytest_plugin``) applies it before collection.
The processes are forked from one that imported sglang once (``forkserver``:
each is still a process of its own, so no variant's fix reaches another),
or are plain ``python -m pytest`` processes where that server cannot start.
Outcomes come from pytest's JUnit XML: a test passed, failed on an
``AssertionError`` (the test's own check), or broke (anything else).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from schedtrace.arms.user import file_spelling, write_files
from schedtrace.replay.repro.forkserver import ForkServer
from schedtrace.tracer.contract.names import ARM_FILES_ENV, FIXES_ENV, STOCK

PASSED: Final = "passes"
FAILED: Final = "fails"
BROKEN: Final = "breaks"
RUN_TIMEOUT_S: Final = 900.0


def _overall(outcomes: Iterable[str]) -> str:
    values = set(outcomes) or {BROKEN}
    return BROKEN if BROKEN in values else FAILED if FAILED in values else PASSED


@dataclass(frozen=True)
class Run:
    """One pytest process: the variant and each test's outcome."""

    variant: str
    outcomes: dict[str, str]  # "module::test" -> PASSED | FAILED | BROKEN
    detail: str  # the first failure's message, or pytest's own complaint
    messages: dict[str, str] = field(default_factory=dict)  # "module::test" -> its failure's first line

    @property
    def outcome(self) -> str:
        """The whole run's: it passes only if every test passed."""
        return _overall(self.outcomes.values())

    def module_outcome(self, module: str) -> str:
        """One module's (its file stem), when several ran together."""
        return _overall(v for k, v in self.outcomes.items() if k.partition("::")[0] == module)


def _outcomes(junit: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Each test's outcome and its failure's first line."""
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '?').rpartition('.')[2]}::{case.get('name', '?')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is None:
            outcomes[name] = BROKEN if case.find("skipped") is not None else PASSED
            continue
        message = problem.get("message", "")
        own_check = problem.tag == "failure" and message.startswith("AssertionError")
        outcomes[name] = FAILED if own_check else BROKEN
        messages[name] = (message.splitlines() or [problem.tag])[0][:300]
    return outcomes, messages


def run_pytest(modules: list[Path], variant: str, *, extra_files: Iterable[Path] = (),
               server: ForkServer | None = None) -> Run:
    """``SCHEDTRACE_FIXES=variant python -m pytest modules...`` in a folder of their own."""
    with tempfile.TemporaryDirectory(prefix="schedtrace-repro-") as tmp:
        work = Path(tmp)
        for path in (*modules, *extra_files):
            shutil.copy2(path, work / path.name)
        (work / "pytest.ini").write_text("[pytest]\n")
        env = {k: v for k, v in os.environ.items() if k not in (FIXES_ENV, ARM_FILES_ENV)}
        if variant != STOCK:
            write_files(variant, work)  # a user arm's diff beside the test: SCHEDTRACE_FIXES=./mine.diff
            env[FIXES_ENV] = file_spelling(variant)
        junit = work / "junit.xml"
        argv = ["-q", "-p", "no:cacheprovider", "-W", "ignore", f"--junitxml={junit}", *(m.name for m in modules)]
        output = work / "pytest.out"
        if server is not None:
            code = server.run(argv, work, env, output, RUN_TIMEOUT_S)
        else:
            with output.open("w") as out:
                try:
                    code = subprocess.run([sys.executable, "-m", "pytest", *argv], cwd=work, env=env, stdout=out,
                                          stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S).returncode
                except subprocess.TimeoutExpired:
                    code = None
        if code is None:
            return Run(variant, {}, f"pytest did not finish in {RUN_TIMEOUT_S:.0f} s")
        if not junit.exists():
            tail = output.read_text(errors="replace").strip().splitlines()[-1:] or [f"exit status {code}"]
            return Run(variant, {}, tail[0][:300])
        outcomes, messages = _outcomes(junit)
        return Run(variant, outcomes, next(iter(messages.values()), ""), messages)


def run_variants(modules: list[Path], variants: list[str], *, jobs: int = 2,
                 extra_files: Iterable[Path] = (), fork: bool = True) -> list[Run]:
    """``run_pytest`` for each variant, ``jobs`` at a time, in the order given
    (``fork=False``: plain ``python -m pytest`` processes, as bench_repro compares)."""
    extra = tuple(extra_files)
    with ForkServer() as server, ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        forks = server if fork and server.start() else None
        return list(pool.map(lambda v: run_pytest(modules, v, extra_files=extra, server=forks), variants))
