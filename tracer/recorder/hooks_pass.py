"""The hooks inside a scheduling pass: the pass itself, the policy's order and each admission step.

Each factory takes the ``Recorder`` and returns one AROUND hook; the table in
``hooks`` names the target of each. They run on sglang's scheduler thread.
"""

from __future__ import annotations

from schedtrace.tracer.recorder.lifecycle import Recorder
from schedtrace.tracer.recorder.targets import Hook


def pass_hook(rec: Recorder) -> Hook:
    """The pass: the idle check first, then a ``PassCapture`` from entry to exit."""
    hook_failed, emitter = rec.hook_failed, rec.emitter

    def hook(original, scheduler, *args, **kwargs):
        # Idle check first: most passes are idle and must cost next to nothing.
        if not scheduler.waiting_queue and scheduler.chunked_req is None:
            emitter.idle += 1
            return original(scheduler, *args, **kwargs)
        try:
            running_batch = kwargs["running_batch"] if "running_batch" in kwargs else args[1]
            cap = rec.begin_pass(scheduler, running_batch)
        except Exception as exc:
            rec.abandon_pass()
            hook_failed("pass", exc)
            return original(scheduler, *args, **kwargs)
        try:
            result = original(scheduler, *args, **kwargs)
        except BaseException as exc:
            try:
                rec.end_pass(scheduler, cap, None, exc)
            except Exception as hook_exc:
                hook_failed("pass", hook_exc)
            raise
        try:
            rec.end_pass(scheduler, cap, result, None)
        except Exception as exc:
            rec.abandon_pass()
            hook_failed("pass", exc)
        return result

    return hook


def calc_priority_hook(rec: Recorder) -> Hook:
    """``calc_priority`` returned: the order it left, this pass's prefix matches."""
    hook_failed = rec.hook_failed

    def hook(original, policy, waiting_queue, *args, **kwargs):
        result = original(policy, waiting_queue, *args, **kwargs)
        cap = rec.capture
        if cap is not None:
            try:
                cap.sorted(policy, waiting_queue)
            except Exception as exc:
                hook_failed("calc_priority", exc)
        return result

    return hook


def release_hook(rec: Recorder) -> Hook:
    """A running request priority preemption released, and the counts it left."""
    hook_failed = rec.hook_failed

    def hook(original, batch, idx, *args, **kwargs):
        cap = rec.capture
        if cap is None:  # retraction in decode: its Retract record says it
            return original(batch, idx, *args, **kwargs)
        rid = batch.reqs[idx].rid
        result = original(batch, idx, *args, **kwargs)
        try:
            cap.release(rid, batch.token_to_kv_pool_allocator.available_size(), rec.pool_readers().evictable())
        except Exception as exc:
            hook_failed("release_req", exc)
        return result

    return hook


def init_new_hook(rec: Recorder) -> Hook:
    """``ScheduleBatch.init_new``: admission is over (``Pass.batch_is_full_out``)."""
    hook_failed = rec.hook_failed

    def hook(original, cls, *args, **kwargs):
        cap = rec.capture
        if cap is not None:
            try:
                cap.batch_built()
            except Exception as exc:
                hook_failed("init_new", exc)
        return original(cls, *args, **kwargs)

    return hook


def add_one_req_hook(rec: Recorder) -> Hook:
    """Each candidate: its row, and what pinning its prefix took from the evictable counts."""
    hook_failed, probe = rec.hook_failed, rec.lock_probe

    def hook(original, adder, req, *args, **kwargs):
        cap = rec.capture
        if cap is None:
            return original(adder, req, *args, **kwargs)
        try:
            run_list = adder.can_run_list
            before = len(run_list)
            prefix_len = req.prefix_len
            # The pin on the candidate's prefix moves only its not-yet-locked part out
            # of the evictable budget; replay needs that amount (Candidate.locked_evictable,
            # and on SWA locked_swa_evictable).
            # An empty match pins the root, which is never evictable: nothing to measure.
            if prefix_len:
                probe.drop = probe.swa_drop = None
                probe.armed = True
        except Exception as exc:
            probe.armed = False
            hook_failed("add_one_req", exc)
            return original(adder, req, *args, **kwargs)
        try:
            result = original(adder, req, *args, **kwargs)
        finally:
            if prefix_len:
                probe.armed = False
                locked, locked_swa = probe.drop, probe.swa_drop
            else:
                locked, locked_swa = 0, None
        try:
            # The capture's rows, written out here (a method call per candidate costs the pass):
            # admitted, with prefix and extend as the adder left them; else the prefix before.
            if len(run_list) > before and run_list[-1] is req:
                row = (req, req.prefix_len, req.extend_len)
                cap.admitted.append(row)
                cap.candidates.append((*row, result, locked, locked_swa))
            else:
                cap.candidates.append((req, prefix_len, 0, result, locked, locked_swa))
            if probe.error is not None:
                error, probe.error = probe.error, None
                hook_failed("lock_probe", error)
        except Exception as exc:
            hook_failed("add_one_req", exc)
        return result

    return hook


def add_chunked_req_hook(rec: Recorder) -> Hook:
    """The continuing chunk: what its budget offered and what ran."""
    hook_failed = rec.hook_failed

    def hook(original, adder, req, *args, **kwargs):
        cap = rec.capture
        if cap is None:
            return original(adder, req, *args, **kwargs)
        try:
            before = len(adder.can_run_list)
            cap.in_chunk = True
            cap.budget = None
        except Exception as exc:
            hook_failed("add_chunked_req", exc)
            return original(adder, req, *args, **kwargs)
        try:
            result = original(adder, req, *args, **kwargs)
        finally:
            cap.in_chunk = False
        try:
            run_list = adder.can_run_list
            cap.add_chunk(req, len(run_list) > before and run_list[-1] is req)
        except Exception as exc:
            hook_failed("add_chunked_req", exc)
        return result

    return hook


def chunk_budget_hook(rec: Recorder) -> Hook:
    """The budget's ``available_chunk_tokens`` while the continuing chunk is sized."""
    def hook(original, budget, *args, **kwargs):
        result = original(budget, *args, **kwargs)
        cap = rec.capture
        if cap is not None and cap.in_chunk:
            cap.budget = result  # nested super() calls: the outermost result lands last
        return result

    return hook
