"""Timing primitives: CUDA events, CUDA-graph replay, host clocks for CPU paths.

Rules (the project's measurement rules): warm up first; report the median and the p20-p80
spread of many repetitions; device time comes from events or graph replay, never from host
clocks around asynchronous work; cold-L2 numbers rotate over inputs larger than the L2.

The GPU's SM and memory clocks are sampled while the timed work runs (``ClockSampler``: once
after the warm-up, from a thread during the timed loop, and once more before the final
synchronisation), and every GPU ``Timing`` carries their medians; ``clock_summary`` gives the
spread over everything timed in this process, for a run's metadata.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import math
import subprocess
import threading
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
    sm_clock_mhz: float = math.nan    # median SM clock sampled during the timed work (GPU only)
    mem_clock_mhz: float = math.nan   # median memory clock, likewise
    floor_us: float = math.nan        # eager only: median of the call path's host floor, timed
    #                                   interleaved with the calls (``time_events(floor=...)``)

    def as_dict(self) -> dict:
        """The fields as a results-row dict (refused for a :class:`Rounds` timing not yet run)."""
        if self.reps == 0:
            raise RuntimeError("this timing has not been taken yet: call its Rounds' run() first")
        return asdict(self)


def summarize(samples_us: Sequence[float], mode: str, l2: str, clocks: "ClockSampler | None" = None) -> Timing:
    """Median and p20/p80 of per-call times in microseconds (with the clocks ``clocks`` sampled)."""
    a = np.asarray(samples_us, dtype=np.float64)
    if a.size == 0:
        raise ValueError("samples_us: no samples")
    sm, mem = clocks.medians() if clocks is not None else (math.nan, math.nan)
    return Timing(float(np.median(a)), float(np.percentile(a, 20)), float(np.percentile(a, 80)),
                  int(a.size), mode, l2, sm, mem)


_RUN_CLOCKS: list[tuple[float, float]] = []   # every (sm, mem) sample of this process


class ClockSampler:
    """SM and memory clocks (MHz) of the current GPU, sampled while timed work runs.

    Use as a context manager around a timed loop: call ``sample()`` at points where the GPU is
    known busy (after queuing the warm-up, before the final synchronisation); with NVML
    (``pynvml``, the ``nvidia-ml-py`` package) a thread also samples every ``interval`` seconds.
    Without it a sample runs ``nvidia-smi`` (50-100 ms of a process that queries the driver), so
    there is no thread and a reading stands for :data:`SMI_REUSE_S` seconds: one spawned every
    20 ms beside a timed loop slowed every timing by the samples' wall time and loaded the host
    whose dispatch the eager timings measure.
    Without a GPU or a way to read its clocks the medians are NaN.
    """

    def __init__(self, interval: float = 0.02):
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = None
        self._read, self._cheap = _clock_reader(torch.cuda.current_device()) if torch.cuda.is_available() else (None, False)

    def sample(self) -> None:
        """Read the clocks once now."""
        if self._read is None:
            return
        try:
            value = self._read()
        except Exception:
            return
        self.samples.append(value)
        _RUN_CLOCKS.append(value)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> "ClockSampler":
        if self._read is not None and self._cheap:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def medians(self) -> tuple[float, float]:
        """Median SM and memory clock of the samples (NaN when none)."""
        if not self.samples:
            return math.nan, math.nan
        a = np.asarray(self.samples, dtype=np.float64)
        return float(np.median(a[:, 0])), float(np.median(a[:, 1]))


SMI_REUSE_S = 1.0   # without NVML, an nvidia-smi reading stands for the next second's samples


@functools.lru_cache(maxsize=None)
def _clock_reader(index: int):
    """``(read, cheap)``: a function returning (SM MHz, memory MHz) of GPU ``index`` (torch's
    numbering) and whether it is cheap (NVML) rather than an ``nvidia-smi`` run; (None, False)
    when neither works. Made once per GPU and process; the GPU is found by its PCI bus id, which
    CUDA_VISIBLE_DEVICES does not renumber."""
    p = torch.cuda.get_device_properties(index)
    bus = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
        return (lambda: (float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                         float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)))), True
    except Exception:
        pass

    last = [-math.inf, (math.nan, math.nan)]   # (when, value): a reading is reused for SMI_REUSE_S

    def smi() -> tuple[float, float]:
        if time.perf_counter() - last[0] > SMI_REUSE_S:
            out = subprocess.run(["nvidia-smi", "-i", bus, "--query-gpu=clocks.sm,clocks.mem",
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5).stdout
            last[:] = time.perf_counter(), tuple(float(x) for x in out.strip().splitlines()[0].split(","))
        return last[1]
    try:
        smi()
    except Exception:
        return None, False
    return smi, False


def clock_summary() -> dict:
    """Clocks sampled during all timed work of this process: median, min and max, in MHz
    (empty when nothing was sampled)."""
    if not _RUN_CLOCKS:
        return {}
    a = np.asarray(_RUN_CLOCKS, dtype=np.float64)
    return {"sm_clock_mhz": float(np.median(a[:, 0])), "sm_clock_min_mhz": float(a[:, 0].min()),
            "sm_clock_max_mhz": float(a[:, 0].max()), "mem_clock_mhz": float(np.median(a[:, 1])),
            "clock_samples": int(len(a)), "clocks_sampled": "during the timed work"}


@contextlib.contextmanager
def host_clock():
    """The clock of host timings, as a context that yields a function returning seconds.

    Where CUDA is available: wall time (``time.perf_counter``); host paths there issue launches
    or wait for the GPU. On a CPU-only machine: the calling thread's CPU time
    (``time.thread_time``), with torch single-threaded inside the block (restored after), so
    the thread does all the timed work and the time is the work's own. Time the thread spends
    descheduled (other processes, the notebook's I/O threads, the hypervisor) does not enter
    it, and no parallel region waits on a descheduled thread: on a shared 2-core host one busy
    neighbour made a two-threaded eager step 20x slower by the wall clock. On a quiet host
    the two clocks agree within about 1%.
    """
    if torch.cuda.is_available():
        yield time.perf_counter
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield time.thread_time
    finally:
        torch.set_num_threads(threads)


def time_host(fn: Callable[[], object], *, reps: int = 20, warmup: int = 2,
              sync: bool = False, min_s: float | None = None) -> Timing:
    """Time of a host (CPU) path on ``host_clock``; ``sync`` waits for the GPU after each call.

    After the warm-up (:func:`warm_up`), at least ``reps`` calls and more until ``min_s``
    seconds (default :data:`HOST_MIN_S`) have passed (at most :data:`HOST_MAX_REPS`), the
    garbage collector off (:class:`QuietGC`).
    """
    with host_clock() as clock, QuietGC():
        warm_up(fn, warmup, sync)
        samples = _host_samples(fn, clock, reps, HOST_MIN_S if min_s is None else min_s, sync)
    return summarize(samples, "host", "n/a")


def _host_samples(fn, clock, reps: int, min_s: float, sync: bool) -> list[float]:
    """Microseconds of ``reps`` calls and on until ``min_s`` seconds have passed (at most
    :data:`HOST_MAX_REPS`)."""
    samples, end = [], time.perf_counter() + min_s
    while len(samples) < reps or (time.perf_counter() < end and len(samples) < HOST_MAX_REPS):
        if sync:
            torch.cuda.synchronize()
        t0 = clock()
        fn()
        if sync:
            torch.cuda.synchronize()
        samples.append((clock() - t0) * 1e6)
    return samples


class L2Flush:
    """Reads a GPU buffer twice the L2 size so the next kernel starts with a cold L2.

    ``device``: the GPU (default: torch's current one). Reading, not writing: a written buffer
    leaves the L2 full of dirty lines, which the timed kernel would then write back to HBM
    (up to the L2's 60 MB on an H200, 3% more traffic for a 2 GiB bandwidth probe). The buffer
    must live on the GPU: one left on the host (``torch.empty(device=None)``) flushed nothing
    and cost every cold eager call a 120 MB memset on the CPU, single-threaded under the
    sweep's workers; the GPU idled meanwhile and the cold CPU caches slowed the timed Python
    dispatch that followed.
    """

    def __init__(self, device=None):
        index = None if device is None else torch.device(device).index
        device = torch.device("cuda", torch.cuda.current_device() if index is None else index)
        props = torch.cuda.get_device_properties(device)
        self.buf = torch.zeros(2 * props.L2_cache_size // 4 + 1024, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buf.amax()


# Host and eager timings call the function for at least WARMUP_S seconds first (CPU clocks up,
# allocator and caches warm), and a host timing samples for at least HOST_MIN_S seconds (up to
# HOST_MAX_REPS calls): medians of 3 calls of the tree build's host paths moved 10-30% between
# back-to-back passes on a busy 2-core host; sampled for 0.1-0.3 s, the median pair moves 1-2%.
WARMUP_S = 0.01
HOST_MIN_S = 0.1
HOST_MAX_REPS = 2000


class QuietGC:
    """Python's cyclic garbage collector off for the block (restored after): a collection
    inside a timed call of a short host path is an outlier of its own. (No collection first: a
    full one costs ~0.1 s with torch loaded.)"""

    def __enter__(self) -> None:
        self._enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc) -> None:
        if self._enabled:
            gc.enable()


def warm_up(fn: Callable[[], object], calls: int, sync: bool = False) -> None:
    """Call ``fn`` ``calls`` times and on until :data:`WARMUP_S` seconds have passed (``sync``:
    wait for the GPU after each call, so that no backlog of queued work builds up)."""
    end, n = time.perf_counter() + WARMUP_S, 0
    while n < calls or time.perf_counter() < end:
        fn()
        if sync:
            torch.cuda.synchronize()
        n += 1


def time_events(fns: Sequence[Callable[[], object]], *, reps: int = 100, warmup: int = 5,
                l2: str = "warm", floor: Callable[[], object] | None = None) -> Timing:
    """Per-call device time of eager launches, by CUDA events around each call.

    ``fns`` are equivalent calls over different inputs; they are used round-robin, so a
    list whose inputs together exceed the L2 keeps it cold. With ``l2="cold"`` the L2 is
    also flushed before every timed call (the flush is outside the events, and finished before
    the call starts: a flush still running when the start event is queued would overlap the
    call's host dispatch, and a host-bound call would come out faster than its own floor). The
    warm-up is :func:`warm_up`'s (each call synchronised); the timed loop runs with the garbage
    collector off (:class:`QuietGC`).

    ``floor``: the same call path at a trivial size (its host floor), timed the same way right
    after every call (once the call has finished), so that both medians see the same host. An
    eager call is mostly Python dispatch, and the host's speed moves by up to 2x within seconds
    on a shared VM: a floor measured once per run judged later calls against another machine
    state (eager points came out "faster than their floor"). Its median is ``floor_us``.
    """
    flush = L2Flush() if l2 == "cold" else None
    rotation = itertools.cycle(fns)
    warm_up(lambda: next(rotation)(), warmup, sync=True)
    if floor is not None:
        warm_up(floor, warmup, sync=True)
    with QuietGC(), ClockSampler() as clocks:
        clocks.sample()
        calls, floors = _event_samples(fns, reps, 0, flush, floor)
        clocks.sample()
    t = summarize(calls, "eager", l2, clocks)
    if floor is not None:
        t.floor_us = float(np.median(floors))
    return t


def _event_samples(fns, reps: int, first: int, flush, floor) -> tuple[list[float], list[float]]:
    """Microseconds of ``reps`` eager calls by CUDA events, the inputs round-robin from index
    ``first`` (``flush``: called and finished before every call; ``floor``: timed right after
    every call, once it has finished, and finished before the next call), and of the floor calls
    ([] without one). With a floor, the call and the floor both start on an idle GPU: a call
    recorded right behind the floor's kernel had its start event wait for that kernel, so its
    span lost part of its own dispatch, and at host-bound ops (accept at 66-70 us) it came out
    2-6% under its floor, "faster than its roof", in a default H200 run (h200-20261201-6)."""
    events = [[torch.cuda.Event(enable_timing=True) for _ in range(4 if floor else 2)] for _ in range(reps)]
    for i, ev in enumerate(events):
        if flush is not None:
            flush()
            torch.cuda.synchronize()   # else the flush's GPU time hides part of the dispatch
        ev[0].record()
        fns[(first + i) % len(fns)]()
        ev[1].record()
        if floor is not None:
            torch.cuda.synchronize()   # the floor starts on an idle GPU, as the call did
            ev[2].record()
            floor()
            ev[3].record()
            torch.cuda.synchronize()   # the next call starts on an idle GPU, as the floor did
    torch.cuda.synchronize()
    calls = [ev[0].elapsed_time(ev[1]) * 1e3 for ev in events]
    return calls, ([ev[2].elapsed_time(ev[3]) * 1e3 for ev in events] if floor is not None else [])


ROUNDS = 10   # rounds of every Rounds timing
HOST_REWARM_S = 1e-3   # host calls shorter than this get an untimed call at the start of each round


class Rounds:
    """Host-dispatched timings (eager calls, host paths) taken in rounds spread over time.

    An eager call at small sizes and a host path are mostly the host CPU's work, and on a shared
    machine the host's speed moves by up to 2x for stretches of a fraction of a second to
    seconds. A median of repetitions taken back to back measures whichever stretch they fell
    in: two runs of the same sweep agreed within 5% at 47% of such points. Here each timing
    registered with :meth:`events` or :meth:`host` is taken in ``rounds`` rounds, and the rounds
    of all timings alternate (round 0 of every timing, then round 1, ...), so that one timing's
    rounds spread over the whole :meth:`run`. Its median, p20 and p80 are those of its quietest
    round (the round with the lowest median; interference only adds time, so the quietest
    round is the host's own speed), its ``floor_us`` the median of the floor's own quietest round (the
    floor's samples from the op's quietest round, where the floor itself may have been disturbed,
    came out above the op's time at 3 points of a default H200 run), its ``reps`` every
    call of every round. On an H200's host, timings of 22 eager calls and 7 host paths taken
    this way agreed within 5% between passes at 99.8% (eager) and 100% (host) of the pairs,
    against 66.1% and 53.8% back to back (``scripts/host_timing_check.py``,
    ``results/host_timing_h200``). Between runs minutes apart the host's speed also drifts, by
    whole families of points: rounds do not remove that. The H200 host runs for stretches of up
    to ~15 s at about half speed, with no steal time and no run-queue wait
    (``scripts/host_steal_probe.py``), longer than a notebook's rounds. Gating the rounds on a
    pure-Python speed meter read around each round was tried and measured (run h200-20261202-1):
    host-dispatched points agreed between the twins at 58% where both runs' meters read full
    speed and at 65% where not, so the meter does not say which rounds to trust, and the rounds
    are not gated on it. Nor are they moved to a vCPU at full speed: at any moment some vCPUs run
    at full speed and others at half, but six processes timing the same calls one after another
    agreed within 5% at 39% of the pairs that way against 32% without, and in another set of six,
    three consecutive processes (about 45 s) ran every timing at half speed, their quietest
    rounds included (``scripts/host_process_check.py``, ``results/host_process_h200``).

    The registering methods return a :class:`Timing` whose fields :meth:`run` fills in; until
    then its ``reps`` is 0 and its ``as_dict`` refuses.
    """

    def __init__(self, rounds: int = ROUNDS):
        if not (isinstance(rounds, int) and rounds >= 1):
            raise ValueError(f"rounds: expected a positive int, got {rounds!r}")
        self.rounds = rounds
        self._jobs: list[dict] = []

    @property
    def pending(self) -> int:
        """Timings registered and not yet taken."""
        return len(self._jobs)

    def events(self, fns: Sequence[Callable[[], object]], *, reps: int = 100, warmup: int = 5,
               l2: str = "warm", floor: Callable[[], object] | None = None) -> Timing:
        """Register an eager timing, as :func:`time_events` takes it, in ``min(rounds, reps)``
        rounds of about ``reps / rounds`` calls (a warm-L2 timing makes one untimed call first
        in every round: the other timings' rounds evicted its data)."""
        t = Timing(math.nan, math.nan, math.nan, 0, "eager", l2)
        self._jobs.append({"kind": "events", "fns": list(fns), "reps": reps, "warmup": warmup, "l2": l2,
                           "floor": floor, "timing": t})
        return t

    def host(self, fn: Callable[[], object], *, reps: int = 20, warmup: int = 2, sync: bool = False,
             min_s: float | None = None) -> Timing:
        """Register a host timing, as :func:`time_host` takes it: ``reps`` calls and ``min_s``
        seconds in all, spread over up to ``rounds`` rounds (fewer for a call so long that a
        round would otherwise exceed its share of ``min_s``), each round at least one timed call,
        after an untimed one where a call is shorter than :data:`HOST_REWARM_S` (the other
        timings' rounds evicted its data from the CPU caches; a longer call rewarms them itself)."""
        t = Timing(math.nan, math.nan, math.nan, 0, "host", "n/a")
        self._jobs.append({"kind": "host", "fn": fn, "reps": reps, "warmup": warmup, "sync": sync,
                           "min_s": HOST_MIN_S if min_s is None else min_s, "timing": t})
        return t

    def run(self) -> None:
        """Take every registered timing (each warmed up in its first round), fill in their
        timings, and forget them."""
        jobs, self._jobs = self._jobs, []
        if not jobs:
            return
        gpu = any(j["kind"] == "events" for j in jobs)
        flush = L2Flush() if any(j["kind"] == "events" and j["l2"] == "cold" for j in jobs) else None
        with host_clock() as clock, QuietGC(), (ClockSampler() if gpu else contextlib.nullcontext()) as clocks:
            for j in jobs:
                j["rounds"], j["taken"] = [], 0
            for r in range(self.rounds):
                for j in jobs:
                    if r == 0:
                        self._start(j, clock)
                    if r < j["n_rounds"]:
                        j["rounds"].append(self._round(j, flush, clock))
            for j in jobs:
                self._fill(j, clocks)

    def _start(self, j: dict, clock) -> None:
        if j["kind"] == "events":
            rotation = itertools.cycle(j["fns"])
            warm_up(lambda: next(rotation)(), j["warmup"], sync=True)
            if j["floor"] is not None:
                warm_up(j["floor"], j["warmup"], sync=True)
            j["n_rounds"] = min(self.rounds, j["reps"])
            return
        warm_up(j["fn"], j["warmup"], j["sync"])
        t0 = clock()
        j["fn"]()
        if j["sync"]:
            torch.cuda.synchronize()
        j["per_call"] = per_call = max(clock() - t0, 1e-7)
        j["n_rounds"] = max(1, min(self.rounds, max(j["reps"], int(j["min_s"] / per_call))))

    def _round(self, j: dict, flush, clock) -> tuple[list[float], list[float]]:
        n = j["n_rounds"]
        if j["kind"] == "events":
            reps = j["reps"] // n + (len(j["rounds"]) < j["reps"] % n)
            if j["l2"] == "warm":
                j["fns"][j["taken"] % len(j["fns"])]()
            out = _event_samples(j["fns"], reps, j["taken"], flush if j["l2"] == "cold" else None, j["floor"])
            j["taken"] += reps
            return out
        if j["per_call"] < HOST_REWARM_S:
            j["fn"]()
        return _host_samples(j["fn"], clock, -(-j["reps"] // n), j["min_s"] / n, j["sync"]), []

    @staticmethod
    def _fill(j: dict, clocks) -> None:
        quiet = min(range(len(j["rounds"])), key=lambda i: np.median(j["rounds"][i][0]))
        calls, floors = j["rounds"][quiet]
        t = summarize(calls, j["timing"].mode, j["timing"].l2, clocks if j["kind"] == "events" else None)
        t.reps = sum(len(c) for c, _ in j["rounds"])
        if floors:   # the floor's own quietest round: interference only adds time to it too
            t.floor_us = min(float(np.median(f)) for _, f in j["rounds"])
        j["timing"].__dict__.update(t.__dict__)


HOLD_CYCLES = 200_000   # GPU clock cycles of hold_device: ~0.1 ms at an H200's 1980 MHz
HOLD_HZ = 2.0e9         # cycles per second the holds are sized with (at or above the SM clock: a hold
#                         sized with it lasts at least as long as meant)
HOLD_MARGIN = 3.0       # a hold covers this many times the longest submission seen
MAX_HOLD_CYCLES = 40_000_000   # ~20 ms


def hold_device(cycles: int = HOLD_CYCLES) -> None:
    """Queue a kernel that keeps the current GPU busy for ``cycles`` cycles, touching no memory,
    so that work the host queues next starts when it ends rather than when the host gets it
    submitted."""
    torch.cuda._sleep(int(cycles))


def hold_cycles_for(replay: Callable[[], object], tries: int = 3) -> int:
    """Cycles of :func:`hold_device` that cover the host's submission of ``replay`` (a graph's
    ``replay``), :data:`HOLD_MARGIN` times over its longest of ``tries`` submissions, at least
    :data:`HOLD_CYCLES`. Submitting a graph takes the host time that grows with its nodes: an
    fp8 MoE layer of 66 kernels, 10 per graph, took longer than a fixed 0.1 ms hold, so the
    GPU waited for the host inside the timed span, and the layer measured 5-10% slower in the
    twin of a run whose host was slower (``results/rerun_agreement_h200/h200-20261201-5.md``)."""
    worst = 0.0
    for _ in range(tries):
        torch.cuda.synchronize()
        hold_device()   # submitted against a busy GPU, as in the timing
        t0 = time.perf_counter()
        replay()
        worst = max(worst, time.perf_counter() - t0)
    torch.cuda.synchronize()
    return int(min(max(HOLD_CYCLES, HOLD_MARGIN * worst * HOLD_HZ), MAX_HOLD_CYCLES))


def time_held(fn: Callable[[], object], *, reps: int = 50, warmup: int = 3, l2: str = "warm") -> Timing:
    """Per-call device time of eager launches, each queued behind a device hold.

    Before every call :func:`hold_device` keeps the GPU busy for as long as
    :func:`hold_cycles_for` finds the host takes to submit ``fn``, so the start event fires
    with the call already queued: the host's dispatch stays out of the span, as under
    :func:`time_graph`, but the call runs as it does eagerly. (A device-to-device ``copy_``
    captured in a graph becomes memcpy nodes, which ran at 2.78 TB/s on an H200 where the
    eager copy ran at 4.1-4.2.) ``l2="cold"`` flushes the L2 before each hold. Mode "eager".
    """
    warm_up(fn, warmup, sync=True)
    with QuietGC():
        return _held(fn, reps, l2, "eager")


def _held(call: Callable[[], object], reps: int, l2: str, mode: str, per_call: int = 1) -> Timing:
    """``reps`` timings of ``call`` (already warm), each queued behind a :func:`hold_device` sized
    by :func:`hold_cycles_for` (``l2="cold"``: the L2 flushed before each hold), divided by the
    ``per_call`` calls it makes; summarised with the clocks sampled while it ran."""
    return _held_many([call], reps, l2, mode, per_call)[0]


def _per_call(value: int | Sequence[int], n: int, name: str) -> list[int]:
    """``value`` for each of ``n`` calls: one for all, or a sequence of one entry a call."""
    each = [value] * n if isinstance(value, int) else list(value)
    if len(each) != n:
        raise ValueError(f"{name}: expected one entry per call ({n}), got {len(each)}")
    return each


def _held_many(calls: Sequence[Callable[[], object]], reps: int | Sequence[int], l2: str, mode: str,
               per_call: int | Sequence[int] = 1) -> list[Timing]:
    """:func:`_held` for several calls in turn: repetition i of every call before repetition
    i + 1 of any, so that each call's samples span the same stretch of time (and of SM clocks:
    under a power cap the clock falls over seconds, and calls timed one after the other
    compared clock states, not calls). ``reps`` and ``per_call`` may differ per call (a
    sequence, one entry a call): a call whose repetitions are done drops out of the turn. Every
    timing carries the clocks sampled over all of them."""
    reps_of, per_of = _per_call(reps, len(calls), "reps"), _per_call(per_call, len(calls), "per_call")
    flush = L2Flush() if l2 == "cold" else None
    holds = [hold_cycles_for(call) for call in calls]
    samples: list[list[float]] = [[] for _ in calls]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    last = max(reps_of, default=0) - 1
    with ClockSampler() as clocks:
        for i in range(last + 1):
            for j, call in enumerate(calls):
                if i >= reps_of[j]:
                    continue
                if flush is not None:
                    flush()
                hold_device(holds[j])
                start.record()
                call()
                end.record()
                if i in (0, last):   # the call is queued or running: a busy-clock sample
                    clocks.sample()
                end.synchronize()
                samples[j].append(start.elapsed_time(end) * 1e3 / per_of[j])
    return [summarize(s, mode, l2, clocks) for s in samples]


def time_graph(fn: Callable[[], object], *, reps: int = 50, calls_per_graph: int = 20,
               warmup: int = 3, l2: str = "warm") -> Timing:
    """Per-call device time under CUDA-graph replay.

    ``fn`` is captured ``calls_per_graph`` times into one graph; each replay is timed with
    events and divided by ``calls_per_graph``, so launch gaps inside the graph count. The
    replay's own launch does not: :func:`hold_device` keeps the GPU busy while the host submits
    the replay (for as long as :func:`hold_cycles_for` finds a submission takes), so the start
    event fires with the graph already queued. (On an idle GPU the
    start event fires at once and the host's submission, 10-40 us that follow the host's speed,
    entered the span: a 50-100 us step-model component differed by 5-15% between two runs of
    the same sweep.) ``l2="cold"`` flushes the L2 before each replay, which only makes the
    first call of the graph cold: use it with ``calls_per_graph=1``.
    """
    return time_graphs([fn], reps=reps, calls_per_graph=calls_per_graph, warmup=warmup, l2=l2)[0]


def time_graphs(fns: Sequence[Callable[[], object]], *, reps: int | Sequence[int] = 50,
                calls_per_graph: int | Sequence[int] = 20, warmup: int = 3, l2: str = "warm") -> list[Timing]:
    """:func:`time_graph` of several calls, their replays interleaved (:func:`_held_many`): one
    timing per call, in order; ``reps`` and ``calls_per_graph`` one for all or one per call. Use it where calls are compared: timed one after the other on
    an H100 under its power cap, the same kernel's per-call time moved 5% between the first and
    the second half of 150 calls as the SM clock fell (``scripts/mode_probe.py``), and a
    verify grid that timed them one after the other had ``fused`` slower than ``cascade`` at 5
    shapes where alternating calls had it 1-3% faster at each (docs/perf_log.md, session 30)."""
    per_graph = _per_call(calls_per_graph, len(fns), "calls_per_graph")
    graphs = []
    for fn, calls in zip(fns, per_graph):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        for _ in range(warmup):
            graph.replay()
        graphs.append(graph)
    return _held_many([g.replay for g in graphs], reps, l2, "graph", per_graph)
