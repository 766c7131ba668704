"""A copy of a Req sglang built is that Req again: equal all the way down, sharing nothing mutable."""

from __future__ import annotations

from array import array
from typing import Any

import torch

from schedtrace.replay.req_copies import Pristine, _shared, _slot_names
from schedtrace.replay.requests import ArrivalBook, TokenSource, _build_req
from schedtrace.tracer.contract.schema import Arrival


def _parts(obj: Any) -> dict[str, Any]:
    out = dict(object.__getattribute__(obj, "__dict__")) if "__dict__" in dir(type(obj)) else {}
    for name in _slot_names(type(obj)):
        try:
            out[name] = object.__getattribute__(obj, name)
        except AttributeError:
            pass
    return out


def _assert_same_shape(copy: Any, template: Any, path: str, pairs: dict[int, int]) -> None:
    """Equal values; every mutable object a new one, and shared in the copy where the template shares it."""
    if _shared(template):
        assert copy == template or (copy != copy and template != template), path
        return
    assert type(copy) is type(template) and copy is not template, path
    assert pairs.setdefault(id(template), id(copy)) == id(copy), f"{path}: an alias lost"
    if isinstance(template, (array, list, set)):
        assert list(copy) == list(template), path
    elif isinstance(template, dict):
        assert copy == template, path
    else:
        mine, theirs = _parts(copy), _parts(template)
        assert mine.keys() == theirs.keys(), path
        for name, value in theirs.items():
            _assert_same_shape(mine[name], value, f"{path}.{name}", pairs)


def _tokens() -> TokenSource:
    book = ArrivalBook(4)
    book.note(Arrival(rid="a", t_ns=1, input_len=12, max_new_tokens=5, prefix_ids=bytes(range(16))))
    return TokenSource(book=book)


def test_a_copy_is_the_req_sglang_built_with_nothing_mutable_shared() -> None:
    tokens, pristine = _tokens(), Pristine()
    build = lambda: _build_req(tokens, "a", 12, 3, 5, False, 2)  # noqa: E731
    first = pristine.get("a", tokens.book.prefix_ids("a"), 15, build)
    template = pristine._kept["a"][1]
    assert pristine._kept["a"][2] is not None  # copied, not built each time
    _assert_same_shape(first, template, "req", {})
    assert first.origin_input_ids is first.origin_input_ids_unpadded  # as sglang builds it
    # What a pass changes on its copy stays there.
    first.output_ids.append(9)
    first.kv.req_pool_idx = 7
    first.time_stats.wait_queue_entry_time = 3.0
    second = pristine.get("a", tokens.book.prefix_ids("a"), 15, build)
    _assert_same_shape(second, template, "req", {})
    assert list(second.output_ids) == list(build().output_ids) and second.kv.req_pool_idx is None


def test_new_prefix_ids_or_an_uncopyable_req_build_again() -> None:
    tokens, pristine = _tokens(), Pristine()
    built: list[Any] = []

    def build() -> Any:
        req = _build_req(tokens, "a", 12, 0, 5, False, None)
        built.append(req)
        return req

    pristine.get("a", b"one", 12, build)
    pristine.get("a", b"two", 12, build)  # another arrival's ids: another template
    assert len(built) == 2

    def with_tensor() -> Any:
        req = build()
        req.extra_tensor = torch.zeros(1)
        return req

    handed = pristine.get("t", b"", 12, with_tensor)
    assert handed is built[-1] and len(built) == 4  # the template, then a Req of its own
