"""The arms: what a replay, a sandbox or a live server runs sglang under.

Below the recorder, replay and the sandbox (docs/architecture.md): the four
built-in fixes (``fixes``), the code swap they use (``patching``), user arms
from a unified diff or a module of source edits (``user``, ``unidiff``,
``overlay``), and the arm names and switching (``variants``). Nothing here
imports sglang until an arm is prepared.
"""
