"""Write the pytest module for shrunk divergences: constants, the state, one assertion each.

Pure: ``emit_module(cases)`` returns the module's text. The module imports
only sglang, pytest and the standard library (``scaffold``); each case is
one test function that builds the shrunk state with real sglang objects,
calls the real function (``Scheduler._get_new_batch_prefill_raw`` or
``handle_attention_aiter``) and asserts what the fix decides, with one
message saying what went wrong.

The assertion checks one field, the first that applies of: the error (a
pass that raised), the admitted list (which also shows a continuing chunk's
size and any over-ask), the new chunked request, ``batch_is_full``, the
aiter method. ``expected_to_pass`` predicts, from the replay's own decisions,
which variants the test passes under; ``verify`` checks the prediction.
"""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass
from typing import Any

from schedtrace.arms.fixes import FIXES
from schedtrace.arms.patching import sglang_version
from schedtrace.replay.repro import scaffold
from schedtrace.replay.repro.target import Divergent
from schedtrace.arms.user import file_spelling
from schedtrace.arms.variants import parse_variant, targets_of, user_members
from schedtrace.tracer.analysis import capacity
from schedtrace.tracer.contract.names import split_error
from schedtrace.arms.fixes import AITER, CHUNK_CAP, LATCH, ONE_CHUNK
from schedtrace.tracer.contract.report import (KIND_ADMITTED, KIND_AITER, KIND_CHUNK, KIND_ERROR, KIND_NEW_CHUNKED,
                                               KIND_OVER_ASK, Decision)
from schedtrace.tracer.contract.schema import Aiter, Header, Pass

# fix -> (test name, the behaviour the fix restores, as the assertion message ends)
FIX_STORIES: dict[str, tuple[str, str]] = {
    CHUNK_CAP.name: ("test_continuing_chunk_fits_free_kv",
                  "a continuing chunk must fit the free + evictable KV, or wait"),
    ONE_CHUNK.name: ("test_one_unfinished_chunked_request",
                  "only one unfinished chunked request can be tracked"),
    LATCH.name: ("test_latched_batch_is_full_still_admits",
              "a latched batch_is_full must not keep the queue shut while KV and a request slot are free"),
    AITER.name: ("test_over_capacity_extend_stays_chunked",
              "an over-capacity extend must stay on the chunked-KV path, in graph context too"),
}


@dataclass(frozen=True)
class Case:
    """A divergence after shrinking: what one test function is written from."""

    divergent: Divergent
    subject: Pass | Aiter  # the shrunk state
    shrunk: str  # "24 waiting, 8 running → 1 waiting, 1 running; kv ..."
    stock: Decision  # stock on the shrunk state
    fixed: Decision  # the fix set on the shrunk state


# ----------------------------------------------------------------- the check


def asserted_field(d: Divergent) -> str:
    """The one decision field the test asserts (see the module docstring)."""
    kinds = set(d.kinds)
    if KIND_AITER in kinds:
        return "aiter_method"
    if KIND_ERROR in kinds:
        return "error"
    if kinds & {KIND_ADMITTED, KIND_CHUNK, KIND_OVER_ASK}:
        return "admitted"
    return "new_chunked_rid" if KIND_NEW_CHUNKED in kinds else "batch_is_full"


def asserted_value(decision: Decision, field: str) -> Any:
    value = getattr(decision, field)
    if field == "error":
        return None if value is None else split_error(value)[0]
    if field == "admitted":
        return [tuple(pair) for pair in value]
    return value


def expected_to_pass(case: Case, decision: Decision) -> bool:
    """Whether the test passes for a variant that decides ``decision`` on the shrunk state."""
    field = asserted_field(case.divergent)
    return asserted_value(decision, field) == asserted_value(case.fixed, field)


# --------------------------------------------------------------- formatting


def lit(value: Any) -> str:
    """A Python literal, double-quoted as black would write it."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, tuple):
        inner = ", ".join(lit(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(lit(v) for v in value) + "]"
    return repr(value)


def fix_names(fixes: str) -> list[str]:
    """The built-in fixes of a variant in order, then its user arms' labels (``FILE@HASH``)."""
    members = parse_variant(fixes)
    return [name for name in FIXES if name in members] + user_members(members)


def _story_of(fix: str) -> tuple[str, str]:
    """A fix's (test name, behaviour); a user arm's are said from its file."""
    if fix in FIX_STORIES:
        return FIX_STORIES[fix]
    stem = re.sub(r"\W+", "_", fix.partition("@")[0].rsplit(".", 1)[0]).strip("_").lower() or "arm"
    return f"test_decides_as_{stem}", f"the scheduler must decide as the change in {fix} does"


def function_name(case: Case) -> str:
    """The test function's name, from the fixes it is for."""
    names = [_story_of(f)[0].removeprefix("test_") for f in fix_names(case.divergent.fixes)]
    return "test_" + "_and_".join(names)


def story(case: Case) -> str:
    """What the fix restores, as the assertion message ends."""
    return "; ".join(_story_of(f)[1] for f in fix_names(case.divergent.fixes))


def sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def edited_functions(fixes: str) -> str:
    targets = [t.partition(":")[2] for f in fix_names(fixes) for t in targets_of(f)]
    return ", ".join(dict.fromkeys(targets))


def _said(decision: Decision) -> str:
    """A decision in words, for the docstring."""
    if decision.aiter_method is not None:
        return f"picks {decision.aiter_method}"
    if decision.error is not None:
        return f"raises {split_error(decision.error)[0]}"
    admitted = ", ".join(f"{rid} ({n} token{'s' * (n != 1)})" for rid, n in decision.admitted) or "nothing"
    latch = "set" if decision.batch_is_full else "clear"
    return f"admits {admitted}, batch_is_full {latch}"


# ----------------------------------------------------------------- sections


def _server_constants(header: Header, p: Pass) -> list[str]:
    args = header.server_args
    micro = capacity.micro_batch_cap(header)  # pp_max_micro_batch_size, as PassDriver sets it
    grid = max(1, header.mamba_chunk_grid)
    lines = [
        "# The recording server's options",
        f"SCHEDULE_POLICY = {lit(args.schedule_policy)}",
        f"PAGE_SIZE = {max(1, args.page_size)}",
        f"MAX_RUNNING_REQUESTS = {lit(args.max_running_requests)}",
        f"MICRO_BATCH_SIZE = {'MAX_RUNNING_REQUESTS' if micro == args.max_running_requests else micro}"
        "  # pp_max_micro_batch_size, one pipeline stage",
        f"MAX_PREFILL_TOKENS = {args.max_prefill_tokens}",
        f"CHUNKED_PREFILL_SIZE = {lit(p.chunked_prefill_size)}",
        f"KV_POOL_TOKENS = {args.max_total_tokens or 0}",
        f"DISABLE_RADIX_CACHE = {args.disable_radix_cache}",
        f"ENABLE_MIXED_CHUNK = {args.enable_mixed_chunk}",
        f"ENABLE_PRIORITY_SCHEDULING = {args.enable_priority_scheduling}",
    ]
    if grid > 1:
        lines += [f"MAMBA_CHUNK_GRID = {grid}",
                  "TRUNCATION_ALIGN_SIZE = MAMBA_CHUNK_GRID  # what Scheduler.init_mamba_truncation_align makes of it"]
    else:
        lines.append("TRUNCATION_ALIGN_SIZE = None")
    return lines


def _state_constants(p: Pass) -> list[str]:
    return [
        "# The scheduler's state at the pass",
        f"FREE_KV_TOKENS = {p.kv.available}",
        f"EVICTABLE_KV_TOKENS = {p.kv.evictable}",
        f"FREE_REQ_SLOTS = {p.req_slots_free}",
        f"NEW_TOKEN_RATIO = {p.new_token_ratio}",
        f"BATCH_IS_FULL = {p.batch_is_full_in}",
    ]


def _options(**options: Any) -> str:
    defaults = {"output": 0, "ignore_eos": False, "priority": None}
    return "".join(f", {k}={lit(v)}" for k, v in options.items() if defaults.get(k, object()) != v)


def _req_lines(p: Pass) -> list[str]:
    waiting = []
    for w in p.waiting:
        make = "retracted_req" if w.output_len else "make_req"
        opts = _options(max_new=w.max_new_tokens, output=w.output_len, ignore_eos=w.ignore_eos, priority=w.priority)
        waiting.append(f"{make}({lit(w.rid)}, {w.input_len}{opts})")
    running = [
        f"running_req({lit(r.rid)}, {r.input_len}"
        f"{_options(max_new=r.max_new_tokens, output=r.output_len, ignore_eos=r.ignore_eos)})"
        for r in p.running
    ]
    lines = [f"    waiting = [{', '.join(waiting)}]", f"    running = [{', '.join(running)}]"]
    c = p.chunked
    if c is not None:
        opts = _options(prefilled=c.prefix_len, max_new=c.max_new_tokens, output=c.output_len, ignore_eos=c.ignore_eos)
        lines.append(f"    chunked = chunked_req({lit(c.rid)}, {c.input_len}{opts})")
    return lines


def _cache_line(p: Pass) -> tuple[str, list[str]]:
    """(the tree cache construction, the classes it needs)."""
    prefixes = {w.rid: w.prefix_len for w in p.waiting if w.prefix_len}
    shares = {c.rid: c.locked_evictable for c in p.candidates if c.locked_evictable is not None and c.rid in prefixes}
    if not prefixes:
        return "    tree_cache = EvictableOnlyCache(EVICTABLE_KV_TOKENS)", [scaffold.EVICTABLE_ONLY_CACHE]
    return (f"    tree_cache = PrefixCache(EVICTABLE_KV_TOKENS, prefixes={lit_dict(prefixes)}, "
            f"shares={lit_dict(shares)})", [scaffold.EVICTABLE_ONLY_CACHE, scaffold.PREFIX_CACHE])


def lit_dict(d: dict[str, int]) -> str:
    return "{" + ", ".join(f"{lit(k)}: {v}" for k, v in d.items()) + "}"


def _message(case: Case) -> str:
    """What went wrong, as the first line of the assertion message (an f-string)."""
    field = asserted_field(case.divergent)
    if field == "error":
        return "the pass raised {outcome.error}: "
    if field == "admitted":
        return "admitted {outcome.admitted} with {FREE_KV_TOKENS} free and {EVICTABLE_KV_TOKENS} evictable KV tokens: "
    if field == "new_chunked_rid":
        return "the pass made {outcome.new_chunked_rid} the chunked request: "
    return "batch_is_full is {outcome.batch_is_full} after the pass: "


def _pass_test(case: Case) -> tuple[list[str], str]:
    """(helper blocks, the test function) for a pass."""
    p = case.subject
    assert isinstance(p, Pass)
    cache, cache_classes = _cache_line(p)
    field = asserted_field(case.divergent)
    outcome_field = "new_chunked_rid" if field == "new_chunked_rid" else field
    expected = asserted_value(case.fixed, field)
    helpers = [scaffold.OUTCOME, scaffold.FREE_KV, *cache_classes, scaffold.FREE_ROWS, scaffold.MAKE_REQ]
    if any(w.output_len for w in p.waiting):
        helpers.append(scaffold.RETRACTED_REQ)
    if p.chunked is not None:
        helpers.append(scaffold.CHUNKED_REQ)
    helpers.append(scaffold.SCHEDULER)
    fixtures = "monkeypatch, server_args"
    chunked_arg = ", chunked=chunked" if p.chunked is not None else ""
    if field == "error" and expected is None:
        check = "outcome.error is None"
    elif field == "error":
        check = f"(outcome.error or '').startswith({lit(expected + ':')})"
    else:
        check = f"outcome.{outcome_field} == {lit(expected)}"
    body = [
        f"def {function_name(case)}({fixtures}):",
        f'    """{sentence(story(case))}"""',
        *_req_lines(p),
        cache,
        f"    outcome = run_pass(monkeypatch, tree_cache, waiting=waiting, running=running{chunked_arg})",
        f"    assert {check}, (",
        f'        f"{_message(case)}"',
        f"        {lit(story(case))}",
        "    )",
    ]
    return helpers, "\n".join(body)


def _aiter_test(case: Case) -> tuple[list[str], str]:
    e = case.subject
    assert isinstance(e, Aiter)
    lines = [f"def {function_name(case)}(monkeypatch):", f'    """{sentence(story(case))}"""']
    if e.in_piecewise_graph:
        lines.append('    monkeypatch.setattr(piecewise_graph, "_in_tc_piecewise_cuda_graph", True)')
    if e.in_breakable_graph:
        lines.append('    monkeypatch.setattr(breakable_graph, "_in_breakable_cuda_graph", True)')
    lines += [
        "    batch = ForwardBatchLengths(FORWARD_MODE, SEQ_LENS_SUM, MAX_CHUNK_CAPACITY)",
        "    method = handle_attention_aiter(None, batch).name",
        f"    assert method == {lit(case.fixed.aiter_method)}, (",
        '        f"picked {method} for {SEQ_LENS_SUM} tokens over a capacity of {MAX_CHUNK_CAPACITY}: "',
        f"        {lit(story(case))}",
        "    )",
    ]
    return [scaffold.FORWARD_BATCH], "\n".join(lines)


def _aiter_constants(e: Aiter) -> list[str]:
    return [
        "# The forward batch at the aiter dispatch",
        f"FORWARD_MODE = ForwardMode.{e.forward_mode}",
        f"SEQ_LENS_SUM = {e.seq_lens_sum}",
        f"MAX_CHUNK_CAPACITY = {e.max_chunk_capacity}",
    ]


# ------------------------------------------------------------------- module


def paragraph(text: str) -> list[str]:
    return [*textwrap.wrap(text, width=88, break_on_hyphens=False), ""]


def _docstring(cases: list[Case]) -> str:
    first = cases[0].divergent
    version = sglang_version()
    fixes = ",".join(dict.fromkeys(f for c in cases for f in fix_names(c.divergent.fixes)))
    lines = [sentence(story(cases[0])), ""]
    for case in cases:
        d = case.divergent
        what = "the aiter event after pass" if d.is_aiter else "pass"
        lines += paragraph(
            f"Found by schedtrace in {d.trace}, {what} {d.pass_} ({', '.join(d.kinds)}), and shrunk by"
            f" delta debugging ({case.shrunk}), each step checked with the real sglang code. On that"
            f" state stock sglang {_said(case.stock)}; with the {d.fixes} fix"
            f" ({edited_functions(d.fixes)}) it {_said(case.fixed)}."
        )
    several = "es" if "," in fixes else ""
    lines += paragraph(
        f"Fails on sglang {version} as released; passes with the {fixes} fix{several}"
        f" (`SCHEDTRACE_FIXES={file_spelling(fixes)} python -m pytest` applies it, with schedtrace installed)."
        f" Recorded with sglang {first.header.sglang_version}. Imports only sglang, pytest and"
        " the standard library; runs on CPU."
    )
    return '"""' + "\n".join(lines).rstrip() + '\n"""'


def emit_module(cases: list[Case]) -> str:
    """The text of one pytest module with a test per case."""
    stdlib: list[str] = []
    sglang: list[str] = []
    constants: list[str] = []
    helpers: list[str] = []
    tests: list[str] = []
    for case in cases:
        if isinstance(case.subject, Aiter):
            sglang += scaffold.AITER_IMPORTS
            constants += _aiter_constants(case.subject)
            blocks, test = _aiter_test(case)
        else:
            header = case.divergent.header
            stdlib += scaffold.PASS_STDLIB
            sglang += scaffold.PASS_IMPORTS
            constants += _server_constants(header, case.subject) + [""] + _state_constants(case.subject)
            blocks, test = _pass_test(case)
            if header.mamba_chunk_grid > 1:
                sglang.append(scaffold.GRID_IMPORT)
                blocks.append(scaffold.GRID_FIXTURE)
            if header.exact_chunk_fill:
                sglang.append(scaffold.GRID_IMPORT)
                blocks.append(scaffold.EXACT_FILL_FIXTURE)
        constants.append("")
        helpers += blocks
        tests.append(test)
    imports = [
        "from __future__ import annotations",
        "\n".join(sorted(set(stdlib), key=lambda line: (line.startswith("from "), line))),
        "import pytest" if stdlib else "",
        scaffold.STUB.strip(),
        "\n".join(_late_import(line) for line in sorted(set(sglang))),
    ]
    head = _docstring(cases) + "\n\n" + "\n\n".join(part for part in imports if part)
    body = ["\n".join(constants).strip(), *[block.strip() for block in dict.fromkeys(helpers)], *tests]
    return "\n\n\n".join([head, *body]) + "\n"



def _late_import(line: str, width: int = 100) -> str:
    """An import after ``maybe_stub_sgl_kernel()``, wrapped in parentheses when long."""
    if len(line) + len("  # noqa: E402") <= width:
        return f"{line}  # noqa: E402"
    module, _, names = line.partition(" import ")
    inner = "".join(f"    {name.strip()},\n" for name in names.split(","))
    return f"{module} import (  # noqa: E402\n{inner})"
