"""Moved to ``schedtrace.arms.variants`` (the arms' own room); kept for replay's driver and engine
and for emitted tests that import the old name. Same functions, same state."""

from schedtrace.arms.variants import (  # noqa: F401
    VARIANT_NAMES, active_fixes, applied, install_fixes_from_env, parse_variant, prepared, set_active,
    variant_label,
)
