"""Prefix identity without token ids: chained, keyed block hashes (``Arrival.prefix_ids``).

A request's input is cut into blocks of ``Header.prefix_block`` tokens (the
page size, or ``PREFIX_BLOCK_TOKENS`` on page size 1; the last block may be
partial). Block i's id is the 8-byte digest of one keyed BLAKE2b fed the
request's cache namespace and then every token of blocks 0..i, so within one
run two requests have equal ids for block i exactly when their first blocks
up to i are equal token for token (as Mooncake traces' ``hash_ids``).

The key is a per-run random secret (``SCHEDTRACE_PREFIX_KEY``, set by the
launcher's plugin load and inherited by every rank, never written): without
it an id confirms no guessed text, and ids of two runs cannot be linked.

Why 16 tokens on page size 1: sglang's in-batch prefix checks compare match
lengths against ``IN_BATCH_PREFIX_CACHING_*`` thresholds of 32, a multiple of
16, and a block-rounded match is on the same side of such a threshold as the
token-exact one. Pure: stdlib only.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from typing import Final

PREFIX_ID_BYTES: Final = 8
PREFIX_BLOCK_TOKENS: Final = 16  # the block on page size 1
KEY_BYTES: Final = 32  # BLAKE2b's largest key
_TOKEN = "q"  # every token id as 8 bytes, whatever container sglang holds it in


def block_tokens(page_size: int) -> int:
    """Tokens per prefix id for a server of ``page_size``."""
    return page_size if page_size > 1 else PREFIX_BLOCK_TOKENS


def id_count(input_len: int, block: int) -> int:
    """How many ids a request of ``input_len`` tokens has."""
    return -(-input_len // block) if block > 0 else 0


def prefix_ids(key: bytes, tokens: Sequence[int], block: int, namespace: str = "") -> bytes:
    """The request's ids, ``PREFIX_ID_BYTES`` each, concatenated."""
    data = tokens.tobytes() if isinstance(tokens, array) and tokens.typecode == _TOKEN else array(_TOKEN, tokens).tobytes()
    step = block * 8
    h = hashlib.blake2b(namespace.encode("utf-8", "replace") + b"\0", digest_size=PREFIX_ID_BYTES, key=key)
    out = bytearray()
    view = memoryview(data)
    for start in range(0, len(data), step):
        h.update(view[start : start + step])
        out += h.copy().digest()
    return bytes(out)


def keyed_id(key: bytes, text: str) -> int:
    """One keyed 63-bit id of a string (a routing key): equal strings, equal ids, within a run."""
    digest = hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=PREFIX_ID_BYTES, key=key).digest()
    return int.from_bytes(digest, "little") >> 1


def split_ids(data: bytes) -> list[bytes]:
    """The ids of ``Arrival.prefix_ids``, one ``bytes`` each (a ragged tail is dropped)."""
    n = len(data) // PREFIX_ID_BYTES
    return [data[i * PREFIX_ID_BYTES : (i + 1) * PREFIX_ID_BYTES] for i in range(n)]
