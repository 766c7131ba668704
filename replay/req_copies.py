"""Copies of a ``Req`` sglang built, handed out in place of building an identical one again.

sglang's ``Req()`` is most of what a pass costs to rebuild a waiting request an arm admitted,
and all of what it costs to rebuild the in-flight chunked request on every chunked pass: 15-25 us
each, against a 25-40 us ``decide`` on the hybrid samples. A copy is a third of that. ``Pristine`` keeps the first ``Req`` sglang built for a set of
constructor arguments, never handed to sglang, and hands out copies of it: every mutable
object reachable from it is copied (objects shared inside it stay shared in the copy),
immutable values are shared. A ``Req`` reaching a type not known to copy safely (a tensor, a
weak reference, a lock) is built by sglang each time instead (``Uncopyable``).
"""

from __future__ import annotations

import enum
import types
from array import array
from collections.abc import Callable, Hashable
from typing import Any, ClassVar

import msgspec

_SHARED_TYPES = frozenset({int, float, complex, bool, str, bytes, type(None), range, type, types.FunctionType,
                           types.BuiltinFunctionType})
_FLAT_CONTAINERS = (list, dict, set)  # copied shallowly when every member is shared
_COPIED_PACKAGE = "sglang."  # the classes of a Req's own parts; anything else is refused


class Uncopyable(Exception):
    """The object reaches something a copy cannot safely reproduce."""


def _shared(value: Any) -> bool:
    """Whether ``value`` can be shared between copies: immutable all the way down."""
    kind = type(value)
    if kind in _SHARED_TYPES or isinstance(value, enum.Enum):
        return True
    if kind is tuple or kind is frozenset:
        return all(_shared(member) for member in value)
    return False


def _slot_names(cls: type) -> list[str]:
    names = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names += [slots] if isinstance(slots, str) else [s for s in slots if s not in ("__dict__", "__weakref__")]
    return names


Plan = Callable[[Any, dict], Any]  # (the template's object, the copy's memo) -> its copy


def _uses(value: Any, counts: dict[int, int], path: set[int]) -> None:
    """Count how often each mutable object is reached (``path``: the objects on the way down)."""
    if _shared(value):
        return
    key = id(value)
    counts[key] = counts.get(key, 0) + 1
    if counts[key] > 1:
        return
    kind = type(value)
    if kind is array:
        return
    if kind in _FLAT_CONTAINERS:
        members = [*value, *value.values()] if kind is dict else value
        if not all(_shared(m) for m in members):
            raise Uncopyable(f"a {kind.__name__} holding objects")
        return
    if key in path:
        raise Uncopyable(f"a cycle through {kind.__name__}")
    if not kind.__module__.startswith(_COPIED_PACKAGE):  # a tensor, a weak reference, a lock...
        raise Uncopyable(f"{kind.__module__}.{kind.__qualname__}")
    for member in _members(value).values():
        _uses(member, counts, path | {key})


def _members(obj: Any) -> dict[str, Any]:
    """An instance's attributes: its ``__dict__`` then its set slots."""
    out = dict(object.__getattribute__(obj, "__dict__")) if "__dict__" in dir(type(obj)) else {}
    for name in _slot_names(type(obj)):
        if _is_set(obj, name):
            out[name] = object.__getattribute__(obj, name)
    return out


def _plan(value: Any, counts: dict[int, int]) -> Plan | None:
    """How to copy ``value`` (None: share it); ``counts`` from ``_uses``: one reached more than once
    is copied once per copy (the memo), so that what the template shares the copy shares."""
    if _shared(value):
        return None
    kind = type(value)
    if kind is array:
        plan = _flat(_copy_array)
    elif kind in _FLAT_CONTAINERS:
        plan = _flat(kind.copy)
    else:
        plan = _object_plan(value, counts)
    return _memoised(plan) if counts[id(value)] > 1 else plan


def _copy_array(value: array) -> array:
    return value[:]


def _flat(copy: Callable[[Any], Any]) -> Plan:
    def copied(value: Any, memo: dict) -> Any:
        return copy(value)
    return copied


def _memoised(plan: Plan) -> Plan:
    def copied(value: Any, memo: dict) -> Any:
        out = memo.get(id(value))
        if out is None:
            out = memo[id(value)] = plan(value, memo)
        return out
    return copied


def _object_plan(obj: Any, counts: dict[int, int]) -> Plan:
    """An instance: a bare one of its class with the template's ``__dict__`` and set slots (a
    msgspec struct: its own copy, as msgspec builds its instances), then each mutable attribute
    replaced by its copy, stored without running the class's ``__setattr__`` or properties."""
    cls = type(obj)
    get_attr, set_attr = object.__getattribute__, object.__setattr__
    fields = get_attr(obj, "__dict__") if "__dict__" in dir(cls) else {}
    slots = [name for name in _slot_names(cls) if _is_set(obj, name)]
    mutable_fields = [(name, plan) for name, plan in ((n, _plan(v, counts)) for n, v in fields.items()) if plan]
    mutable_slots = [(name, plan) for name, plan in ((n, _plan(get_attr(obj, n), counts)) for n in slots) if plan]
    struct = isinstance(obj, msgspec.Struct)
    copy_slots = _slots_copier(cls, [] if struct else slots)  # a struct's copy holds them
    has_dict = bool(fields)

    def copied(value: Any, memo: dict) -> Any:
        out = value.__copy__() if struct else cls.__new__(cls)
        if has_dict:
            source = get_attr(value, "__dict__")
            target = get_attr(out, "__dict__")
            target.update(source)
            for name, plan in mutable_fields:
                target[name] = plan(source[name], memo)
        copy_slots(value, out)
        for name, plan in mutable_slots:
            set_attr(out, name, plan(get_attr(value, name), memo))
        return out
    return copied


def _slots_copier(cls: type, slots: list[str]) -> Callable[[Any, Any], None]:
    """``(source, target)``: the slots copied from one to the other. Straight-line attribute
    stores, compiled once per class and slot set: a loop of ``setattr`` by name is several times
    slower, and a Req carries 35 slots in two parts."""
    if not slots:
        return _no_slots
    if cls.__setattr__ is not object.__setattr__ or not all(name.isidentifier() for name in slots):
        def by_name(source: Any, target: Any) -> None:
            for name in slots:
                object.__setattr__(target, name, object.__getattribute__(source, name))
        return by_name
    names = [f"t.{name}" for name in slots], [f"s.{name}" for name in slots]
    code = f"def copy_slots(s, t):\n    {', '.join(names[0])} = {', '.join(names[1])}\n"
    scope: dict[str, Any] = {}
    exec(compile(code, f"<slots of {cls.__qualname__}>", "exec"), scope)  # noqa: S102 - names checked above
    return scope["copy_slots"]


def _no_slots(source: Any, target: Any) -> None:
    pass


def _is_set(obj: Any, slot: str) -> bool:
    try:
        object.__getattribute__(obj, slot)
    except AttributeError:
        return False
    return True


class Pristine:
    """One pristine ``Req`` per key, handed out as copies; bounded by the tokens they hold."""

    TOKENS_HELD: ClassVar[int] = 1 << 22  # the templates' prompts: 32 MiB of int64 tokens

    def __init__(self) -> None:
        self._kept: dict[Hashable, tuple[Any, Any, Plan | None]] = {}  # key -> (its check, template, plan)
        self._held = 0

    def get(self, key: Hashable, check: Any, size: int, build: Callable[[], Any]) -> Any:
        """A ``Req`` as ``build()`` makes it for ``key``; ``check``: what must be the same object as
        when the template was built (the prefix ids its tokens come from), else it is built again;
        ``size``: the tokens it holds."""
        kept = self._kept.get(key)
        if kept is None or kept[0] is not check:
            if size > self.TOKENS_HELD:
                return build()
            if self._held + size > self.TOKENS_HELD:
                self._kept.clear()
                self._held = 0
            template = build()
            try:
                counts: dict[int, int] = {}
                _uses(template, counts, set())
                plan = _plan(template, counts)
            except Uncopyable:
                plan = None  # sglang builds it each time
            kept = self._kept[key] = (check, template, plan)
            self._held += size
        plan = kept[2]
        return build() if plan is None else plan(kept[1], {})
