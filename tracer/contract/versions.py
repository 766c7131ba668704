"""Installed versions of the distributions a trace or a fix names."""

from __future__ import annotations

import functools
import importlib.metadata


@functools.cache
def installed_version(dist: str) -> str:
    """The installed version of a distribution, or "unknown"."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
