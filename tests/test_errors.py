"""The error tree: every error crosses a process boundary whole (worker pools and Ray pickle them)."""

from __future__ import annotations

import multiprocessing
import pickle

import pytest

from schedtrace.tracer.contract import errors
from schedtrace.tracer.contract.framing import Gap

GAP = Gap(start=100, end=180, lost=3, reason="batch fails its checksum", first_bad=120)
SAMPLES = [
    errors.TraceDamagedError("/t.trace", GAP),
    errors.TraceFormatError("/t.trace", 42, "expected a pass record", record=7),
    errors.TraceSetError("/t.part001.trace", "part 1 missing"),
    errors.FixMismatchError("latch", "Scheduler._get_new_batch_prefill_raw", "0.5.22", "source differs"),
    errors.UsageError("--jobs must be at least 1, got 0"),
]


@pytest.mark.parametrize("error", SAMPLES, ids=lambda e: type(e).__name__)
def test_an_error_survives_pickling_with_its_message_and_attributes(error: errors.SchedtraceError) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error) and back.__dict__ == error.__dict__


def _raise_damaged(_: int) -> None:
    raise SAMPLES[0]


def test_an_error_in_a_worker_process_reaches_the_parent() -> None:
    # Before errors pickled whole, this hung: the pool could not rebuild the worker's exception.
    with multiprocessing.get_context("fork").Pool(1) as pool:
        with pytest.raises(errors.TraceDamagedError) as caught:
            pool.map_async(_raise_damaged, [0], chunksize=1).get(timeout=60)  # a hang fails, not blocks
    assert caught.value.gap == GAP
