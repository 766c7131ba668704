"""The docs tell the truth where a test can tell: names that match, links that exist, the README's bound."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from schedtrace.tracer.recorder.naming import part_name, trace_stem

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", REPO / "traces" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_LINES = 200


def test_every_copy_command_matches_the_names_the_recorder_writes():
    written = part_name(trace_stem("20261201T000000Z-0a1b2c", {"tp_rank": 0, "dp_rank": None, "pp_rank": 0},
                                   4242, "gpu-host-7"), 0)
    patterns = [(doc.name, m) for doc in DOCS for m in re.findall(r"(schedtrace-[^\s`'\"]*\.trace)", doc.read_text())
                if "*" in m]
    assert patterns
    for doc, pattern in patterns:
        assert fnmatch.fnmatch(written, Path(pattern).name), f"{doc}: {pattern} matches no file the recorder writes"


def test_every_relative_link_in_the_docs_exists():
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.relative_to(REPO)} links to {target}, which is not there"


def test_the_readme_is_short_and_keeps_the_two_commands():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= README_LINES
    assert "make demo" in text and "make test" in text
    assert "docs/glossary.md" in text and "docs/tui.svg" in text
    assert (REPO / "docs" / "tui.svg").read_text().lstrip().startswith("<svg")


def test_the_readme_picture_is_the_divergence_snapshot_the_tui_tests_hold():
    """docs/tui.svg is a copy: when the snapshot changes (pytest --snapshot-update), copy it again."""
    snapshot = REPO / "tests" / "__snapshots__" / "test_tui_snapshots" / "test_main_screen_with_replay_on_a_divergence.svg"
    assert (REPO / "docs" / "tui.svg").read_bytes() == snapshot.read_bytes()


def test_the_readme_links_every_doc():
    readme = (REPO / "README.md").read_text()
    unlinked = [d.name for d in sorted((REPO / "docs").glob("*.md")) if f"docs/{d.name}" not in readme]
    assert not unlinked, f"the README links no {unlinked}"
