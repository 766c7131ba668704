"""Which trace files a list of paths, directories and glob patterns names, bounded."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from schedtrace.tracer.contract.errors import TraceNotFoundError, TraceSetError

MAX_FILES: Final = 10_000  # files one set may hold: a directory is untrusted too
_GLOB_MAGIC: Final = re.compile(r"[*?[]")


def expand_paths(paths: Iterable[str | os.PathLike], max_files: int = MAX_FILES) -> list[Path]:
    """Files, directories (their ``*.trace`` files) and glob patterns, each file once, in the order given."""
    found: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            matches = sorted(path.glob("*.trace"))
            if not matches:
                raise TraceNotFoundError(str(path), "directory holds no *.trace files")
        elif path.exists():
            matches = [path]
        elif _GLOB_MAGIC.search(str(raw)):
            matches = sorted(Path(m) for m in glob.glob(str(raw)) if not Path(m).is_dir())
            if not matches:
                raise TraceNotFoundError(str(raw), "no trace file matches this pattern")
        else:
            raise TraceNotFoundError(str(path), "no such file")
        for match in matches:
            resolved = match.resolve()
            if resolved not in seen:
                seen.add(resolved)
                found.append(match)
            if len(found) > max_files:
                raise TraceSetError(str(raw), f"more than {max_files} trace files; give fewer paths")
    if not found:
        raise TraceNotFoundError("(no path)", "no trace file given")
    return found
