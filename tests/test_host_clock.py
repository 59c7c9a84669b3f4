"""The clock of host timings on a machine without a GPU: the timing thread's CPU time with
torch single-threaded, so time the thread spends off the CPU (a neighbour's load, a sleep) does
not enter a host timing; torch's thread count is restored after."""
from __future__ import annotations

import time

import pytest
import torch

from kdtree.bench.timing import host_clock, time_host

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only clock (wall time with a GPU)")


def test_time_off_the_cpu_does_not_count_and_torch_threads_are_restored():
    before = torch.get_num_threads()
    with host_clock() as clock:
        assert torch.get_num_threads() == 1
        t0, w0 = clock(), time.perf_counter()
        time.sleep(0.05)                                   # off the CPU: 50 ms of wall time
        x = torch.randn(256, 256)
        end = time.perf_counter() + 0.02
        while time.perf_counter() < end:                   # on the CPU: 20 ms of work
            x = x @ x.T / 256
        cpu, wall = clock() - t0, time.perf_counter() - w0
    assert torch.get_num_threads() == before
    assert wall >= 0.07 and 0.01 < cpu < 0.05, (cpu, wall)


def test_a_host_timing_leaves_a_sleep_out():
    t = time_host(lambda: time.sleep(0.002), reps=5, warmup=1, min_s=0.0)
    assert t.mode == "host" and t.median_us < 500                # 2 ms asleep per call, not counted
