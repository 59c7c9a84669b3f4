"""The host timing primitives on CPU: warm-up by time, short host paths sampled for a minimum
time (the repetitions a caller asks for as a floor), the garbage collector off while timing; and
the clock of host timings on a machine without a GPU, the timing thread's CPU time with torch
single-threaded, so time the thread spends off the CPU (a neighbour's load, a sleep) does not
enter a host timing, with torch's thread count restored after."""
from __future__ import annotations

import gc
import math
import time

import pytest
import torch

from kdtree.bench import timing
from kdtree.bench.timing import host_clock, time_host

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only clock (wall time with a GPU)")


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _busy_cpu(seconds: float) -> None:
    """``seconds`` of this thread's CPU time (at least as much wall time), on a loaded host too."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_short_host_paths_are_sampled_for_the_minimum_time(monkeypatch):
    monkeypatch.setattr(timing, "HOST_MIN_S", 0.05)
    calls = []
    t = timing.time_host(lambda: calls.append(1), reps=3, warmup=1)
    assert t.mode == "host" and t.reps > 100 and len(calls) >= t.reps     # far more than the 3 asked for
    assert t.p20_us <= t.median_us <= t.p80_us


def test_slow_host_paths_keep_the_repetitions_asked_for(monkeypatch):
    monkeypatch.setattr(timing, "HOST_MIN_S", 0.02)
    monkeypatch.setattr(timing, "WARMUP_S", 0.0)
    t = timing.time_host(lambda: _busy(0.015), reps=3, warmup=1)
    assert t.reps == 3 and t.median_us > 0


def test_repetitions_are_capped(monkeypatch):
    monkeypatch.setattr(timing, "HOST_MIN_S", 30.0)
    monkeypatch.setattr(timing, "HOST_MAX_REPS", 40)
    assert timing.time_host(lambda: None, reps=3, warmup=0).reps == 40


def test_warm_up_runs_the_calls_asked_for_and_the_minimum_time(monkeypatch):
    monkeypatch.setattr(timing, "WARMUP_S", 0.03)
    n = []
    t0 = time.perf_counter()
    timing.warm_up(lambda: n.append(1), 1)
    assert time.perf_counter() - t0 >= 0.03 and len(n) > 1
    monkeypatch.setattr(timing, "WARMUP_S", 0.0)
    n.clear()
    timing.warm_up(lambda: n.append(1), 5)
    assert len(n) == 5


def test_garbage_collector_is_off_while_timing_and_restored_after(monkeypatch):
    monkeypatch.setattr(timing, "HOST_MIN_S", 0.0)
    seen = []
    assert gc.isenabled()
    timing.time_host(lambda: seen.append(gc.isenabled()), reps=5, warmup=2)
    assert seen and not any(seen) and gc.isenabled()
    gc.disable()
    try:
        with timing.QuietGC():
            pass
        assert not gc.isenabled()                  # a disabled collector stays disabled
    finally:
        gc.enable()


@cpu_only
def test_time_off_the_cpu_does_not_count_and_torch_threads_are_restored():
    before = torch.get_num_threads()
    with host_clock() as clock:
        assert torch.get_num_threads() == 1
        t0, w0 = clock(), time.perf_counter()
        time.sleep(0.05)                                   # off the CPU: 50 ms of wall time
        x = torch.randn(256, 256)
        end = time.thread_time() + 0.02
        while time.thread_time() < end:                    # on the CPU: 20 ms of work, a loaded host too
            x = x @ x.T / 256
        cpu, wall = clock() - t0, time.perf_counter() - w0
    assert torch.get_num_threads() == before
    assert wall >= 0.07 and 0.01 < cpu < 0.05, (cpu, wall)


@cpu_only
def test_a_host_timing_leaves_a_sleep_out():
    t = time_host(lambda: time.sleep(0.002), reps=5, warmup=1, min_s=0.0)
    assert t.mode == "host" and t.median_us < 500                # 2 ms asleep per call, not counted


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_gpu
def test_the_l2_flush_reads_a_gpu_buffer_larger_than_the_l2_on_the_gpu():
    flush = timing.L2Flush()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert flush.buf.is_cuda and flush.buf.numel() * 4 >= 2 * props.L2_cache_size
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    flush()
    start.record()
    flush()
    end.record()
    torch.cuda.synchronize()
    # the read of twice the L2 takes GPU time of the order of its bytes over HBM bandwidth
    assert start.elapsed_time(end) * 1e-3 > flush.buf.numel() * 4 / 20e12


@pytest.mark.gpu
@needs_gpu
def test_eager_timing_times_its_floor_interleaved_and_the_floor_is_cheaper():
    big = torch.zeros(64 << 20, device="cuda")
    small = torch.zeros(1, device="cuda")
    t = timing.time_events([lambda: big.add_(1)], reps=20, warmup=2, floor=lambda: small.add_(1))
    assert t.mode == "eager" and t.floor_us > 0 and t.floor_us < t.median_us
    plain = timing.time_events([lambda: big.add_(1)], reps=5, warmup=1)
    assert plain.floor_us != plain.floor_us     # NaN: no floor asked for


def test_rounds_interleave_timings_and_report_the_quietest_round():
    """Every registered timing gets its rounds in turn (round r of each before round r + 1 of
    any), and its figures are its quietest round's: a stretch of interference that slows the
    first half of the rounds does not enter the median."""
    order, calls = [], {"a": 0}

    def a():
        order.append("a")
        calls["a"] += 1
        _busy_cpu(0.004 if calls["a"] <= 12 else 0.001)   # slow for about the first half of the rounds

    def b():
        order.append("b")
        _busy_cpu(0.001)

    rounds = timing.Rounds(rounds=6)
    ta = rounds.host(a, reps=12, warmup=0, min_s=0.0)
    tb = rounds.host(b, reps=6, warmup=0, min_s=0.0)
    assert rounds.pending == 2
    with pytest.raises(RuntimeError, match="run"):
        ta.as_dict()
    rounds.run()
    assert rounds.pending == 0
    # a: one start call, then 6 rounds of (1 untimed + 2 timed); b likewise with 1 timed.
    runs = "".join(order)
    assert runs.count("ab") >= 6 and runs.count("ba") >= 5, runs
    assert ta.reps == 12 and tb.reps == 6
    assert 800 < ta.median_us < 2000, ta          # the quiet rounds' 1 ms, not the slow 4 ms
    assert ta.p20_us <= ta.median_us <= ta.p80_us
    assert ta.mode == "host" and ta.l2 == "n/a" and math.isnan(ta.sm_clock_mhz)


def test_rounds_split_a_long_host_call_into_fewer_rounds():
    """A host call so long that ``min_s`` is reached in fewer calls takes fewer rounds than
    asked (``reps`` still honoured): a 20 ms call with ``min_s=0.05`` and 3 reps takes 3 rounds."""
    rounds = timing.Rounds(rounds=10)
    t = rounds.host(lambda: _busy_cpu(0.02), reps=3, warmup=0, min_s=0.05)
    rounds.run()
    assert t.reps == 3


def test_rounds_refuse_a_bad_count():
    with pytest.raises(ValueError, match="rounds"):
        timing.Rounds(rounds=0)


@pytest.mark.gpu
@needs_gpu
def test_rounds_eager_timing_with_floor():
    """An eager timing taken in rounds: every call counted, its floor timed beside it and
    cheaper than a heavy call, clocks sampled, the cold one flushed as ``time_events`` does."""
    big = torch.zeros(1 << 24, device="cuda")
    small = torch.zeros(1, device="cuda")
    rounds = timing.Rounds(rounds=4)
    warm = rounds.events([lambda: big.add_(1)], reps=10, warmup=2, floor=lambda: small.add_(1))
    cold = rounds.events([lambda: big.add_(1)], reps=10, warmup=2, l2="cold", floor=lambda: small.add_(1))
    rounds.run()
    for t in (warm, cold):
        assert t.reps == 10 and t.mode == "eager"
        assert t.floor_us < t.median_us
        assert t.sm_clock_mhz > 0
    assert cold.l2 == "cold" and warm.l2 == "warm"


@pytest.mark.gpu
@needs_gpu
def test_a_graph_replay_is_timed_without_its_submission(monkeypatch):
    """Behind ``hold_device`` the start event fires with the replay already queued: a graph of one
    one-element kernel times below the same graph timed from an idle GPU, whose span includes
    the host's submission of the replay."""
    x = torch.zeros(1, device="cuda")
    held = timing.time_graph(lambda: x.add_(1), reps=50, calls_per_graph=1)
    monkeypatch.setattr(timing, "hold_device", lambda cycles=0: None)
    idle = timing.time_graph(lambda: x.add_(1), reps=50, calls_per_graph=1)
    assert held.median_us < idle.median_us, (held, idle)


@pytest.mark.gpu
@needs_gpu
def test_graph_timings_of_several_calls_interleave_and_time_each_its_own(monkeypatch):
    """``time_graphs`` replays its graphs in turn (repetition i of each before i + 1 of any) and
    gives each graph its own times: a graph of large adds times above one of one-element adds,
    whichever comes first, and the single-graph ``time_graph`` agrees with its own entry."""
    small, big = torch.zeros(1, device="cuda"), torch.zeros(1 << 24, device="cuda")
    order = []
    real = timing._held_many

    def spy(calls, *a, **k):
        def tagged(j, call):
            def run():
                order.append(j)
                call()
            return run
        return real([tagged(j, c) for j, c in enumerate(calls)], *a, **k)

    monkeypatch.setattr(timing, "_held_many", spy)
    t_big, t_small = timing.time_graphs([lambda: big.add_(1), lambda: small.add_(1)], reps=6, calls_per_graph=2)
    # hold_cycles_for replays each call a few times first, then the 6 rounds alternate.
    assert order[-12:] == [0, 1] * 6, order
    assert t_big.reps == t_small.reps == 6 and t_big.mode == t_small.mode == "graph"
    assert t_big.median_us > 2 * t_small.median_us, (t_big, t_small)
    t_small2, t_big2 = timing.time_graphs([lambda: small.add_(1), lambda: big.add_(1)], reps=6, calls_per_graph=2)
    assert t_big2.median_us > 2 * t_small2.median_us, (t_big2, t_small2)
    # One repetition count and graph length per call: the shorter run drops out of the turn.
    order.clear()
    t_a, t_b = timing.time_graphs([lambda: small.add_(1), lambda: small.add_(1)], reps=[2, 4], calls_per_graph=[1, 3])
    assert order[-6:] == [0, 1, 0, 1, 1, 1], order
    assert (t_a.reps, t_b.reps) == (2, 4)
    with pytest.raises(ValueError, match="calls_per_graph"):
        timing.time_graphs([lambda: small.add_(1)], calls_per_graph=[1, 2])


@pytest.mark.gpu
@needs_gpu
def test_a_held_eager_call_is_timed_without_its_dispatch():
    """Behind ``hold_device`` an eager one-element add times below the same add timed by
    ``time_events`` from an idle GPU, whose span includes the host's dispatch of the launch."""
    x = torch.zeros(1, device="cuda")
    held = timing.time_held(lambda: x.add_(1), reps=50)
    idle = timing.time_events([lambda: x.add_(1)], reps=50)
    assert held.mode == "eager" and held.reps == 50
    assert held.median_us < idle.median_us, (held, idle)


@pytest.mark.parametrize("submit_s, expect", [(0.0, timing.HOLD_CYCLES), (0.002, None),
                                               (1.0, timing.MAX_HOLD_CYCLES)])
def test_the_hold_covers_the_longest_submission(monkeypatch, submit_s, expect):
    """A graph whose submission takes the host 2 ms gets a hold of at least HOLD_MARGIN x 2 ms
    of cycles, and below the cap unless the host's 2 ms sleep itself ran long enough to reach it
    (a loaded CI host once slept that long); a quick one the fixed floor; a very slow one the cap
    (CUDA calls faked: runs on CPU)."""
    held, slept = [], []

    def submit():
        t0 = time.perf_counter()
        time.sleep(submit_s)
        slept.append(time.perf_counter() - t0)

    monkeypatch.setattr(timing, "hold_device", lambda cycles=timing.HOLD_CYCLES: held.append(cycles))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    cycles = timing.hold_cycles_for(submit if submit_s else (lambda: None), tries=2)
    assert held == [timing.HOLD_CYCLES] * 2   # each submission measured behind the default hold
    if expect is None:
        assert timing.HOLD_MARGIN * submit_s * timing.HOLD_HZ <= cycles <= timing.MAX_HOLD_CYCLES
        assert cycles < timing.MAX_HOLD_CYCLES or timing.HOLD_MARGIN * max(slept) * timing.HOLD_HZ >= cycles
    else:
        assert cycles == expect


@pytest.mark.gpu
@needs_gpu
def test_clock_sampling_costs_a_short_timing_little_wall_time():
    """A 3-call eager timing of a trivial op takes milliseconds, its clocks read: sampling runs
    no nvidia-smi per timing (NVML, or one reading reused for a second)."""
    x = torch.zeros(1, device="cuda")
    timing.time_events([lambda: x.add_(1)], reps=3, warmup=1)   # the reader made once
    t0 = time.perf_counter()
    t = timing.time_events([lambda: x.add_(1)], reps=3, warmup=1)
    assert time.perf_counter() - t0 < 0.05 and t.sm_clock_mhz > 0


def test_rounds_take_the_floor_from_its_own_quietest_round():
    """The op's figures come from its quietest round, its floor from the floor's: a floor
    disturbed in the op's quiet round must not come out above the op's time."""
    t = timing.Timing(math.nan, math.nan, math.nan, 0, "eager", "warm")
    job = {"timing": t, "kind": "events", "rounds": [([10.0, 10.0, 10.0], [9.0, 9.5, 9.0]),
                                                   ([12.0, 12.0, 12.0], [5.0, 5.0, 5.5]),
                                                   ([11.0, 11.0, 11.0], [7.0, 7.0, 7.0])]}
    timing.Rounds._fill(job, None)
    assert t.median_us == 10.0 and t.reps == 9
    assert t.floor_us == 5.0
