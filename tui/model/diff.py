"""Two decisions field by field, as display text."""

from __future__ import annotations

from dataclasses import dataclass

from schedtrace.tracer.contract.report import Decision
from schedtrace.tui.model.rids import short_rid


@dataclass(frozen=True)
class FieldDiff:
    name: str
    old: str
    new: str

    @property
    def differs(self) -> bool:
        return self.old != self.new


def _show(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ", ".join(f"{short_rid(rid)}+{n}" if isinstance(rid, str) else str(rid) for rid, n in value) or "(none)"
    return str(value)


def decision_diff(old: Decision, new: Decision) -> list[FieldDiff]:
    """Every decision field, old next to new, as display text."""
    return [
        FieldDiff(name, _show(getattr(old, name)), _show(getattr(new, name)))
        for name in old.__struct_fields__
    ]
