"""``schedtrace repro``: turn a divergence or a stall into the small test an upstream reviewer accepts.

``target`` finds the divergence at a pass, ``shrink`` (with ``ddmin``) reduces
its state while ``probe`` (the real sglang code under stock and the fix) says
it survives, ``emit`` (with ``scaffold``) writes a pytest module that imports
only sglang, ``verify`` runs it in pytest processes on stock and under each
fix, ``pipeline`` strings them together, and ``stall`` does the same for a
stall with a minimal trace and a closed-loop test. docs/repro.md has it all.
"""
