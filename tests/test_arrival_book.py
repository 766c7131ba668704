"""The driver's ArrivalBook: one entry per live request, bounded against hostile traces."""

from __future__ import annotations

import pytest

from schedtrace.replay.requests import ArrivalBook, TokenSource
from schedtrace.tracer.contract.prefix_ids import PREFIX_ID_BYTES
from schedtrace.tracer.contract.schema import Arrival


def _arrival(rid: str, input_len: int = 32, ids: bytes = b"", **kw) -> Arrival:
    return Arrival(t_ns=kw.pop("t_ns", 5), rid=rid, input_len=input_len, max_new_tokens=8, prefix_ids=ids, **kw)


def test_one_entry_holds_what_the_arrival_recorded() -> None:
    book = ArrivalBook(16)
    book.note(_arrival("a", ids=b"\1" * 16, processed_tokens=7, routing_key=9, priority=3, t_ns=11))
    entry = book.live["a"]
    assert (entry.prefix_ids, entry.stamp, entry.routing, entry.priority, entry.t_ns) == (b"\1" * 16, 7, "9", 3, 11)
    book.requeued("a", 40)
    book.requeued("gone", 41)  # an unknown rid is not invented
    assert book.live["a"].t_ns == 40 and "gone" not in book.live
    book.forget("a")
    assert book.live == {}


def test_ids_past_the_recorded_input_are_not_kept() -> None:
    book = ArrivalBook(16)
    book.note(_arrival("a", input_len=17, ids=b"\2" * (1000 * PREFIX_ID_BYTES)))
    assert len(book.prefix_ids("a")) == 2 * PREFIX_ID_BYTES  # 17 tokens: two blocks
    book.note(_arrival("b", input_len=-5, ids=b"\2" * 64))
    assert book.prefix_ids("b") == b""
    # The tokens built from the kept ids are the ones the whole list gave.
    assert TokenSource(book=book).input_tokens("a", 17) == TokenSource(book=book).input_tokens("a", 17)
    assert len(set(TokenSource(book=book).input_tokens("a", 17))) == 1  # equal ids, one value


def test_a_trace_that_never_finishes_cannot_grow_the_book(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ArrivalBook, "LIMIT", 4)
    book = ArrivalBook(0)
    for n in range(10):
        book.note(_arrival(f"r{n}", ids=b"\3" * 8))
    assert list(book.live) == ["r6", "r7", "r8", "r9"]  # the oldest went
    assert book.prefix_ids("r9") == b""  # block 0: the trace has no ids, none kept


@pytest.mark.parametrize("block,input_len,torn", [(16, 40, 0), (16, 48, 3), (1, 5, 0), (64, 10, 5)])
def test_input_tokens_are_each_blocks_id_value_then_the_requests_own(block: int, input_len: int, torn: int) -> None:
    ids = bytes(range(7, 7 + 8 * -(-input_len // block) - torn))  # a torn last id reads zero-padded
    book = ArrivalBook(block)
    book.note(_arrival("a", input_len=input_len, ids=ids))
    source = TokenSource(book=book)
    kept = book.prefix_ids("a") + bytes(-len(book.prefix_ids("a")) % 8)
    values = [source.vocab + int.from_bytes(kept[i : i + 7], "little") for i in range(0, len(kept), 8)]
    for n in (input_len, input_len + 9):  # past the ids: the request's own token
        want = [v for v in values for _ in range(block)][:n]
        got = source.input_tokens("a", n)
        assert list(got) == want + [source.token_for("a")] * (n - len(want)) and got.typecode == "q"


def test_a_rebuilt_prompt_is_the_first_builds_and_a_copy_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Req is rebuilt each time a pass admits it: its prompt comes from a cache, as a copy, and a
    request noted again with other ids (a new arrival) gets tokens from those."""
    book = ArrivalBook(16)
    book.note(_arrival("a", input_len=40, ids=bytes(range(24))))
    source = TokenSource(book=book)
    first = source.input_tokens("a", 40)
    first[0] = -1  # sglang changing one Req's tokens
    again = source.input_tokens("a", 40)
    assert list(again) == list(TokenSource(book=book).input_tokens("a", 40)) and again[0] != -1
    book.note(_arrival("a", input_len=40, ids=bytes(range(100, 124))))
    assert list(source.input_tokens("a", 40)) == list(TokenSource(book=book).input_tokens("a", 40)) != list(again)
    monkeypatch.setattr(TokenSource, "INPUT_TOKENS_HELD", 50)  # past the bound, the cache starts over
    for rid in ("b", "c", "d"):
        book.note(_arrival(rid, input_len=40, ids=bytes(range(24))))
        source.input_tokens(rid, 40)
    assert source._inputs_held <= 50
