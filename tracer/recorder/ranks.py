"""Where this scheduler sits in the server: its ranks and the widths they are ranks of.

The names are the ``Header``'s rank and width fields (``RANK_FIELDS``, the
schema's ``*_rank`` and ``*_size``), read from
``sglang.srt.runtime_context.get_parallel()``, which the scheduler process
publishes (``publish(..., ranks=SpawnRanks(...))``) before it builds the
``Scheduler``. Each name is read on its own: an unpublished one raises
(``ValueError``/``RuntimeError``), and then the scheduler's own attribute of
that name is used, then a single rank: the header's default, else 0, or None
where the header allows it. ``dp_rank`` is None without a data-parallel
controller; ``attn_dp_rank`` is None without DP attention (sglang itself
reports 0 there).
"""

from __future__ import annotations

import types
from typing import Any, Final, Union, get_args, get_origin

import msgspec

from schedtrace.tracer.contract.schema import Header

Ranks = dict[str, "int | None"]  # RANK_FIELDS -> value


def _single_rank(field: msgspec.structs.FieldInfo) -> int | None:
    if field.default is not msgspec.NODEFAULT:
        return field.default
    optional = get_origin(field.type) in (Union, types.UnionType) and type(None) in get_args(field.type)
    return None if optional else 0


_FIELDS = [f for f in msgspec.structs.fields(Header) if f.name.endswith(("_rank", "_size"))]
RANK_FIELDS: Final = tuple(f.name for f in _FIELDS)
SINGLE_RANK: Final[Ranks] = {f.name: _single_rank(f) for f in _FIELDS}
_MISSING = object()


def _parallel() -> Any:
    try:
        from sglang.srt.runtime_context import get_parallel

        return get_parallel()
    except Exception:  # an sglang without the runtime context
        return None


def _read(parallel: Any, scheduler: Any, name: str) -> Any:
    if parallel is not None:
        try:
            return getattr(parallel, name)
        except Exception:  # not published in this process
            pass
    return getattr(scheduler, name, _MISSING)


def _as_int(value: Any, default: int | None) -> int | None:
    if value is _MISSING or value is None or isinstance(value, bool):
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def read_ranks(scheduler: Any) -> Ranks:
    """The ranks and widths of ``scheduler``'s process, as far as they can be read."""
    parallel = _parallel()
    ranks = {name: _as_int(_read(parallel, scheduler, name), SINGLE_RANK[name]) for name in RANK_FIELDS}
    attn_dp = _read(parallel, scheduler, "attn_dp_enabled")
    if attn_dp is _MISSING:
        attn_dp = (ranks["attn_dp_size"] or 1) > 1
    if not attn_dp:
        ranks["attn_dp_rank"] = None
    return ranks


def ranks_of(**given: int | None) -> Ranks:
    """A single rank with ``given`` ranks and widths set (tests, tools)."""
    unknown = set(given) - set(RANK_FIELDS)
    if unknown:
        raise TypeError(f"not a rank or width: {', '.join(sorted(unknown))}")
    return {**SINGLE_RANK, **given}
