"""A name for one exact trace file, and for several (a rank's parts): what a report says it was made from."""

from __future__ import annotations

import hashlib
from typing import Final

FINGERPRINT_TAIL_BYTES: Final = 4096


def file_fingerprint(data: bytes | memoryview, header_end: int, size: int) -> str:
    """A hash of the header bytes, the file size and its last FINGERPRINT_TAIL_BYTES (``data``: the whole file)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(data[:header_end])
    digest.update(size.to_bytes(8, "big"))
    digest.update(data[max(0, size - FINGERPRINT_TAIL_BYTES) :])
    return f"blake2b:{digest.hexdigest()}"


def combined_fingerprint(prints: list[str]) -> str:
    """One name for several files: one file's own fingerprint, or a hash of theirs."""
    if len(prints) == 1:
        return prints[0]
    return f"blake2b:{hashlib.blake2b(''.join(prints).encode(), digest_size=16).hexdigest()}"
