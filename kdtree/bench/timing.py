"""Timing primitives: CUDA events, CUDA-graph replay, host clocks for CPU paths.

Rules (../DESIGN.md, "Measurement rules"): warm up first; report the median and the p20-p80
spread of many repetitions; device time comes from events or graph replay, never from host
clocks around asynchronous work; cold-L2 numbers rotate over inputs larger than the L2.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np
import torch


@dataclass
class Timing:
    """Summary of repeated measurements, in microseconds."""

    median_us: float
    p20_us: float
    p80_us: float
    reps: int
    mode: str   # "eager", "graph" or "host"
    l2: str     # "warm", "cold" or "n/a" (host paths)

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(samples_us: Sequence[float], mode: str, l2: str) -> Timing:
    """Median and p20/p80 of per-call times in microseconds."""
    a = np.asarray(samples_us, dtype=np.float64)
    if a.size == 0:
        raise ValueError("samples_us: no samples")
    return Timing(float(np.median(a)), float(np.percentile(a, 20)), float(np.percentile(a, 80)),
                  int(a.size), mode, l2)


def time_host(fn: Callable[[], object], *, reps: int = 20, warmup: int = 2,
              sync: bool = False) -> Timing:
    """Wall-clock time of a host (CPU) path; ``sync`` waits for the GPU after each call."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        if sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e6)
    return summarize(samples, "host", "n/a")


class L2Flush:
    """Writes a buffer twice the L2 size so the next kernel starts with a cold L2."""

    def __init__(self, device=None):
        props = torch.cuda.get_device_properties(device)
        self.buf = torch.empty(2 * props.L2_cache_size // 4 + 1024, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buf.fill_(1)


def time_events(fns: Sequence[Callable[[], object]], *, reps: int = 100, warmup: int = 5,
                l2: str = "warm") -> Timing:
    """Per-call device time of eager launches, by CUDA events around each call.

    ``fns`` are equivalent calls over different inputs; they are used round-robin, so a
    list whose inputs together exceed the L2 keeps it cold. With ``l2="cold"`` the L2 is
    also flushed before every timed call (the flush is outside the events).
    """
    flush = L2Flush() if l2 == "cold" else None
    for i in range(warmup):
        fns[i % len(fns)]()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if flush is not None:
            flush()
        starts[i].record()
        fns[i % len(fns)]()
        ends[i].record()
    torch.cuda.synchronize()
    return summarize([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)], "eager", l2)


def time_graph(fn: Callable[[], object], *, reps: int = 50, calls_per_graph: int = 20,
               warmup: int = 3, l2: str = "warm") -> Timing:
    """Per-call device time under CUDA-graph replay.

    ``fn`` is captured ``calls_per_graph`` times into one graph; each replay is timed with
    events and divided by ``calls_per_graph``, so launch gaps inside the graph count but the
    replay's own launch is amortised. ``l2="cold"`` flushes the L2 before each replay, which
    only makes the first call of the graph cold: use it with ``calls_per_graph=1``.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls_per_graph):
            fn()
    flush = L2Flush() if l2 == "cold" else None
    for _ in range(warmup):
        graph.replay()
    samples = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        if flush is not None:
            flush()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls_per_graph)
    return summarize(samples, "graph", l2)
