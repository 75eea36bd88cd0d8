"""Large copies go to the engine that has lately been faster for their size (store.parallel)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from store import parallel
from store.parallel import Engine, EngineChoice

SLOW, FAST = 1e-9, 1e-10  # seconds per byte


def _warm(choice: EngineChoice, size_class: int, times: dict[Engine, float]) -> None:
    """Run the warm-up: every engine makes one untimed copy (it may start its threads),
    then is picked WARMUP times, timed, before the medians decide."""
    seen = []
    while choice.best(size_class) is None:
        engine, timed = choice.pick(size_class)
        seen.append((engine, timed))
        if timed:
            choice.record(size_class, engine, times[engine])
    assert seen == [(e, i > 0) for e in (Engine.FAN, Engine.TORCH)
                    for i in range(EngineChoice.WARMUP + 1)]


def test_an_engines_slow_start_does_not_decide_the_warm_up():
    """torch's first copies start its threads (16 MiB: 9.4 and 3.9 ms, then 1.0 and 0.6
    ms; the fan 1.2-1.4 ms throughout, seen in the bench's reading process): timed from
    the first, they made the warm-up pick the slower fan, which a short-lived process
    kept."""
    choice = EngineChoice()
    torch_copies = [9.4, 3.9, 1.0, 0.6, 0.6]
    while choice.best(24) is None:
        engine, timed = choice.pick(24)
        ms = torch_copies.pop(0) if engine is Engine.TORCH else 1.3
        if timed:
            choice.record(24, engine, ms * 1e-3 / (16 << 20))
    assert choice.best(24) is Engine.TORCH


@pytest.mark.parametrize("fast", list(Engine))
def test_the_faster_engine_copies_after_warm_up(fast):
    choice = EngineChoice()
    times = {e: FAST if e is fast else SLOW for e in Engine}
    _warm(choice, 22, times)
    assert choice.best(22) is fast
    assert choice.pick(22)[0] is fast


def test_the_slower_engine_is_tried_again_more_rarely_the_slower_it_was():
    picks = {}
    for ratio in (2, 8):
        choice = EngineChoice()
        times = {Engine.FAN: FAST, Engine.TORCH: FAST * ratio}
        _warm(choice, 24, times)
        gap = 0
        while (engine := choice.pick(24)[0]) is Engine.FAN:
            choice.record(24, engine, FAST)
            gap += 1
        picks[ratio] = gap
    assert picks[2] >= EngineChoice.EXPLORE  # never tried before EXPLORE copies
    assert picks[8] >= 3 * picks[2]  # the slower it was, the longer it waits
    assert picks[8] <= EngineChoice.EXPLORE_MAX


def test_the_preferred_engine_is_timed_one_copy_in_sample_and_every_trial_is():
    choice = EngineChoice()
    _warm(choice, 22, {Engine.FAN: SLOW, Engine.TORCH: FAST})
    picks = []
    while len(picks) < 10 * EngineChoice.SAMPLE or picks[-1][0] is Engine.TORCH:
        picks.append(choice.pick(22))
    trial = picks[-1]
    assert trial == (Engine.FAN, True)  # the slower engine's trial is always timed
    timed = sum(t for e, t in picks[:-1])
    assert timed == (len(picks) - 1) // EngineChoice.SAMPLE or \
        abs(timed - (len(picks) - 1) / EngineChoice.SAMPLE) <= 1


def test_a_change_of_load_moves_the_copies_to_the_other_engine():
    """TORCH wins on a quiet machine; then its copies stall (a descheduled thread) and
    FAN takes over; when TORCH is quick again, a later trial brings it back."""
    choice = EngineChoice()
    _warm(choice, 23, {Engine.FAN: SLOW, Engine.TORCH: FAST})
    assert choice.best(23) is Engine.TORCH
    for _ in range(EngineChoice.WINDOW):  # stalls fill TORCH's window
        choice.record(23, Engine.TORCH, SLOW * 40)
    assert choice.best(23) is Engine.FAN
    for _ in range(EngineChoice.WINDOW):  # quick again, seen on trials
        choice.record(23, Engine.TORCH, FAST)
    assert choice.best(23) is Engine.TORCH


def test_size_classes_are_decided_apart():
    choice = EngineChoice()
    _warm(choice, 22, {Engine.FAN: SLOW, Engine.TORCH: FAST})
    _warm(choice, 25, {Engine.FAN: FAST, Engine.TORCH: SLOW})
    assert (choice.best(22), choice.best(25)) == (Engine.TORCH, Engine.FAN)


@pytest.mark.parametrize("n", [1 << 20, (2 << 20) + 5, 17 << 20])
def test_both_engines_copy_exactly_and_a_read_only_source_is_fine(n, monkeypatch):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    monkeypatch.setattr(parallel, "THREADS", 2)
    monkeypatch.setattr(parallel, "CHOICE", EngineChoice())
    try:
        data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
        src = np.frombuffer(data, np.uint8)  # read-only, as a reader's view of the pool
        size_class = n.bit_length()
        for _ in range(2 * EngineChoice.WARMUP + 2):  # warm-up: each engine in turn
            dst = np.zeros(n + 8, np.uint8)
            parallel.copy_into(dst[:n], src)
            assert dst[:n].tobytes() == data and not dst[n:].any()
        assert parallel.CHOICE.best(size_class) is not None  # both engines were timed
    finally:
        torch.set_num_threads(threads)
