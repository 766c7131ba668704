"""Nanoseconds as the short text every view shows."""

from __future__ import annotations


def humanize_ns(ns: int) -> str:
    seconds = ns / 1e9
    if seconds < 1:
        return f"{ns / 1e6:.1f}ms"
    if seconds < 120:
        return f"{seconds:.2f}s"
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{seconds:02d}s" if hours else f"{minutes}m{seconds:02d}s"
