"""Records to bytes and back, and the cheap peeks that avoid decoding.

Every record is a msgspec Struct encoded as a tagged msgpack array
(schema.py); the reader looks at a record's tag, and at a pass's ``seq``,
straight from the bytes when it only needs those.
"""

from __future__ import annotations

import sys
from array import array
from typing import Final

import msgspec

from schedtrace.tracer.contract.names import MAX_RECORD_BYTES  # noqa: F401 - read from here too
from schedtrace.tracer.contract.schema import RECORD_TYPES, Record


_encoder = msgspec.msgpack.Encoder()
DECODERS: Final = {tag: msgspec.msgpack.Decoder(cls) for tag, cls in RECORD_TYPES.items()}
# The records that may stand anywhere in the data (the header is first, the footer last).
DATA_DECODERS: Final = {tag: decoder for tag, decoder in DECODERS.items() if tag not in ("header", "footer")}
DELTA_TAG: Final = "delta"  # schema v2 only: a pass written as what changed (delta.py)
V1_DATA_DECODERS: Final = {tag: decoder for tag, decoder in DATA_DECODERS.items() if tag != DELTA_TAG}
PASS_TAGS: Final = frozenset(("pass", DELTA_TAG))  # the records the pass index points at
ARRAYS: Final = frozenset((*range(0x90, 0xA0), 0xDC, 0xDD))  # the first bytes of a msgpack array (a record's)


def encode(record: Record) -> bytes:
    return _encoder.encode(record)


def encode_into(record: Record, buffer: bytearray) -> None:
    """Append one record to ``buffer`` (no copy of what is already there)."""
    _encoder.encode_into(record, buffer, -1)


def offsets_to_bytes(offsets: array) -> bytes:
    """The footer's pass index: little-endian uint64s."""
    if sys.byteorder != "little":
        offsets = array("Q", offsets)
        offsets.byteswap()
    return offsets.tobytes()


def offsets_from_bytes(raw: bytes) -> array:
    """Inverse of ``offsets_to_bytes``; ``raw`` must hold whole 8-byte entries."""
    offsets = array("Q")
    offsets.frombytes(raw)
    if sys.byteorder != "little":
        offsets.byteswap()
    return offsets


def tag_span(data: bytes) -> tuple[str, int] | None:
    """The tag of an encoded record (the first element of its top array) and the position after it."""
    size = len(data)
    if size < 2:
        return None
    first = data[0]
    if 0x90 <= first <= 0x9F:
        pos = 1
    elif first == 0xDC:
        pos = 3
    elif first == 0xDD:
        pos = 5
    else:
        return None
    if pos >= size:
        return None
    marker = data[pos]
    if 0xA0 <= marker <= 0xBF:
        end = pos + 1 + (marker & 0x1F)
        pos += 1
    elif marker == 0xD9 and pos + 1 < size:
        end = pos + 2 + data[pos + 1]
        pos += 2
    else:
        return None
    if end > size:
        return None
    try:
        return data[pos:end].decode(), end
    except UnicodeDecodeError:
        return None


def peek_tag(data: bytes) -> str | None:
    """The tag of an encoded record: the first element of its top array."""
    found = tag_span(data)
    return None if found is None else found[0]


_UINT_WIDTHS: Final = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}


def peek_seq(data: bytes) -> int | None:
    """``Pass.seq`` of an encoded pass record (its second element), or None if not a plain uint."""
    found = tag_span(data)
    if found is None or found[1] >= len(data):
        return None
    pos = found[1]
    marker = data[pos]
    if marker <= 0x7F:
        return marker
    width = _UINT_WIDTHS.get(marker)
    if width is None or pos + 1 + width > len(data):
        return None
    return int.from_bytes(data[pos + 1 : pos + 1 + width], "big")
