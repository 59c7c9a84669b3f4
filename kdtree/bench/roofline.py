"""Hierarchical roofline: which roof binds a measured point, how close it gets, and why.

Every roof is a lower bound on the time of one call, from the one cost model
(``kdtree.bench.models``):

- ``launch``: launches x the measured per-kernel launch latency inside a CUDA graph;
- ``hbm``: the call's HBM bytes (``hbm_bytes``: inputs from a cold L2, intermediates that stay
  in the L2, written bytes that spill) over the HBM bandwidth; zero for a warm L2 when the
  working set fits in the L2;
- ``l2``: the bytes the L2 slices serve and take over the L2 bandwidth (a read probe over a
  resident buffer, every SM reading its own lines). Where the run profiled the point, the
  counters' bytes (``lts__t_sectors_srcunit_tex``); otherwise the model's ``l2_merged``: the
  L2 <-> SM bytes the code moves (re-reads, partials) with every read that co-resident blocks
  issue for the same bytes at the same time counted once, since the L2 request coalescer
  merges such reads before the slices (the SMs' own bytes stay ``l2_bytes``);
- ``tensor`` / ``fp32``: the FLOPs as executed (tile padding included) over the rate of the
  unit the variant runs on;
- ``waves`` (tile kernels on tensor cores): the same rate with whole waves counted. One block
  runs per SM, so a launch takes at least its waves x its longest block's KV tiles at an SM's
  share of the rate: 272 blocks on 132 SMs take three waves however little the third holds,
  and a split with more tiles than the others sets its wave's time. Where this roof binds, the
  diagnosis also gives the time per wave beyond it (a block's prologue, epilogue and stalls).

The attainable time is the largest of these, the binding roof is the one that sets it, and
the fraction is attainable / measured. The compute roofs hold at the SM clock the bf16 rate was
measured at (``Ceilings.tensor_clock_mhz``); a point whose power draw lowered the clock (the
longest calls of an H200 grid: docs/perf_log.md, session 24) has ``clock_ratio`` below 1, and
where a compute roof binds its diagnosis gives the fraction of that roof at its own clock too.
The fraction itself stays against the measured rate. A point whose binding roof is the launch
floor but which takes more than twice that is ``latency``-bound: serial work that no roof
describes. The gap to the *ideal* roof (useful FLOPs on the fastest unit, the minimum bytes
from HBM, or a single launch, whichever is largest) says how far any variant could still go.

Eager timings include kdtree's Python dispatch, so they are never judged against a device
roof: an eager point is compared with the host floor of its op and gets bound ``host``. The
floor is the eager time of the same call path at a trivial size, timed interleaved with the
point's own calls where the benchmark did so (``floor_us``, plus one eager launch per launch
the point makes beyond the trivial call's ``floor_launches``), else the run's per-op floor
(``Ceilings.eager_floor``). Host-timed (CPU) points on a GPU run get no roof either.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kdtree.bench.ceilings import Ceilings
from kdtree.bench.display import eng
from kdtree.bench.models import Cost, cost_for_row, kernel_name

ROOF_LABELS = {"launch": "launch", "hbm": "HBM", "l2": "L2", "tensor": "tensor-core",
               "waves": "whole-wave", "fp32": "fp32", "host": "host", "latency": "latency"}

# Columns classify() adds.
COLUMNS = ("flops", "flops_exec", "bytes_min", "hbm_bytes", "dram_bytes", "l2_bytes", "bytes_moved", "launches",
           "intensity", "intensity_l2", "achieved_tflops", "achieved_tbs", "hbm_tbs", "moved_tbs",
           "attainable_us", "fraction", "bound", "ideal_us", "ideal_roof", "gap_to_ideal", "clock_ratio", "diagnosis")

# A point whose SM clock ran this far or more below the bf16 probe's gets the clock in its diagnosis
# (the sampled clocks step by 15 MHz; 3% is two steps at an H200's 1980 MHz).
CLOCK_NOTE_BELOW = 0.97


def at_clock(fraction, clock_ratio):
    """A compute roof's fraction at the point's own SM clock: ``fraction / clock_ratio`` where the
    clock ran :data:`CLOCK_NOTE_BELOW` or further below the bf16 probe's, else ``fraction`` (also
    where the ratio is unknown). Scalars or arrays."""
    return fraction / np.where(clock_ratio < CLOCK_NOTE_BELOW, clock_ratio, 1.0)


def roof_times(cost: Cost, ceilings: Ceilings, mode: str, l2: str, counted: dict | None = None) -> dict[str, float]:
    """Device lower bounds on one call's time in microseconds, one per roof that applies.

    Parameters
    ----------
    cost : Cost
        The variant's FLOPs, bytes and launches.
    ceilings : Ceilings
        Measured roofs of the device the point ran on.
    mode : {"eager", "graph", "host"}
        Timing mode of the measurement (the launch roof uses that mode's launch latency).
    l2 : {"warm", "cold", "n/a"}
        L2 state of the measurement.
    counted : dict, optional
        The point's counter bytes (``kdtree.bench.counters.counter_bytes``): ``dram`` (every
        launch on a flushed L2) and ``l2`` (what the L2 slices served and took). They replace the
        model's HBM bytes (less the intermediates the model carries between launches in the L2)
        and its merged L2 bytes.
    """
    if l2 not in ("warm", "cold", "n/a"):
        raise ValueError(f"l2: expected 'warm', 'cold' or 'n/a', got {l2!r}")
    times = {"launch": cost.launches * ceilings.launch_us(mode)}
    resident = l2 == "warm" and ceilings.l2_bytes is not None and cost.hbm_bytes <= ceilings.l2_bytes
    hbm = cost.hbm_bytes if counted is None else max(counted["dram"] - (cost.dram_bytes - cost.hbm_bytes), 0.0)
    times["hbm"] = 0.0 if resident else hbm / ceilings.hbm_bw * 1e6
    times["l2"] = (cost.l2_merged if counted is None else counted["l2"]) / ceilings.l2_bw * 1e6
    if cost.compute in ("tensor", "fp32"):
        rate = ceilings.tensor_flops if cost.compute == "tensor" else ceilings.fp32_flops
        times[cost.compute] = cost.flops_exec / rate * 1e6
        if cost.compute == "tensor" and cost.tile_launch is not None:
            times["waves"] = cost.flops_waves / rate * 1e6
    return {k: v for k, v in times.items() if math.isfinite(v)}


def ideal_time(cost: Cost, ceilings: Ceilings, mode: str) -> tuple[float, str]:
    """Best time any variant could reach in ``mode``: the largest of the FLOPs on the fastest
    compute unit (the tensor cores on a GPU), the minimum bytes from HBM, and one launch."""
    unit = "tensor" if not ceilings.fp32_flops > ceilings.tensor_flops else "fp32"   # the faster unit
    rate = ceilings.tensor_flops if unit == "tensor" else ceilings.fp32_flops
    times = {unit: cost.flops / rate * 1e6, "hbm": cost.bytes_min / ceilings.hbm_bw * 1e6,
             "launch": ceilings.launch_us(mode)}
    times = {k: v for k, v in times.items() if math.isfinite(v)}
    roof = max(times, key=times.get)
    return times[roof], roof


def classify_point(cost: Cost, ceilings: Ceilings, median_us: float, mode: str, l2: str,
                   variant: str = "", kernel: str = "", counted: dict | None = None,
                   floor_us: float | None = None, floor_launches: float = math.nan,
                   sm_clock_mhz: float = math.nan) -> dict:
    """Roofline figures of one measured point (the columns of :data:`COLUMNS`).

    ``counted``: the point's counter bytes where the run profiled it (see :func:`roof_times`);
    the diagnosis says whether the memory roofs come from the counters or the model.
    ``sm_clock_mhz``: the median SM clock sampled while the point was timed; with the ceilings'
    ``tensor_clock_mhz`` it gives ``clock_ratio`` (NaN where either is unknown).

    A host-timed point judged against GPU ceilings gets bound ``host`` and no fraction: the
    GPU's roofs say nothing about a CPU path. An eager point on a GPU gets bound ``host`` too,
    with its fraction of the op's host floor (``floor_us`` measured beside it where given, else
    ``Ceilings.eager_floor``): eager time includes the Python dispatch, which no device roof
    describes.
    """
    if not (median_us > 0 and math.isfinite(median_us)):
        raise ValueError(f"median_us: expected a positive time, got {median_us!r}")
    t = median_us * 1e-6
    out = {**{k: cost.columns()[k] for k in ("flops", "flops_exec", "bytes_min", "hbm_bytes", "dram_bytes",
                                             "l2_bytes", "launches")},
           "bytes_moved": cost.bytes_moved, "intensity": cost.intensity, "intensity_l2": cost.intensity_l2,
           "achieved_tflops": cost.flops / t / 1e12, "achieved_tbs": cost.bytes_min / t / 1e12,
           "hbm_tbs": cost.hbm_bytes / t / 1e12, "moved_tbs": cost.bytes_moved / t / 1e12}
    name = variant or "?"
    out["clock_ratio"] = (sm_clock_mhz / ceilings.tensor_clock_mhz
                          if sm_clock_mhz > 0 and ceilings.tensor_clock_mhz > 0 else np.nan)
    none = dict(ideal_us=np.nan, ideal_roof="", gap_to_ideal=np.nan)
    if mode == "host" and ceilings.kind == "gpu":
        out.update(attainable_us=np.nan, fraction=np.nan, bound="host", **none,
                   diagnosis=f"{name}: host (CPU) path; the GPU roofs do not apply")
        return out
    if mode == "eager" and ceilings.kind == "gpu":
        floor = ceilings.eager_floor(kernel_name(kernel), cost.launches)
        if floor_us is not None and math.isfinite(floor_us):   # measured beside the calls
            extra = cost.launches - floor_launches if math.isfinite(floor_launches) else 0
            floor = floor_us + max(extra, 0) * ceilings.launch_eager_us
        out.update(attainable_us=floor, fraction=floor / median_us, bound="host", **none,
                   diagnosis=(f"{name}: eager call, {eng(median_us * 1e-6, 's')} against a host floor of {eng(floor * 1e-6, 's')} "
                              f"({cost.launches} launch{'es' if cost.launches > 1 else ''} through kdtree's Python "
                              f"path), {median_us / floor:.1f}x the floor; the device roofs apply to graph replay"))
        return out
    times = roof_times(cost, ceilings, mode, l2, counted)
    bound = max(times, key=times.get)
    attainable = times[bound]
    ideal, ideal_roof = ideal_time(cost, ceilings, mode)
    gap = median_us / ideal if ideal > 0 else np.nan
    diagnosis = diagnose(name, cost, bound, attainable / median_us, gap, ideal_roof, times, byte_source(cost, counted),
                         median_us)
    own = float(at_clock(attainable / median_us, out["clock_ratio"]))
    if bound in ("tensor", "waves") and own != attainable / median_us:
        diagnosis += (f"; the SM clock ran at {sm_clock_mhz:.0f} MHz, {out['clock_ratio']:.0%} of the "
                      f"{ceilings.tensor_clock_mhz:.0f} MHz the bf16 rate was measured at (power or thermal "
                      f"limit): {own:.0%} of the {ROOF_LABELS[bound]} roof at its own clock")
    if bound == "launch" and attainable / median_us < 0.5:
        bound = "latency"   # far above every roof: serial work, not launches or bytes
    out.update(attainable_us=attainable, fraction=attainable / median_us, bound=bound,
               ideal_us=ideal, ideal_roof=ideal_roof, gap_to_ideal=gap,
               diagnosis=diagnosis)
    return out


def diagnose(variant: str, cost: Cost, bound: str, fraction: float, gap: float, ideal_roof: str,
             times: dict[str, float], source: str = "", median_us: float = math.nan) -> str:
    """One line: the variant's cause, the binding roof and how close, where the memory roofs'
    bytes come from (``source``), the gap to the ideal roof.

    Example: ``"naive: re-reads the latent per head and query (64x the minimum bytes);
    L2-bound at 45% of the L2 roof; 160x below the tensor-core roof"``. Where the ``waves`` roof
    binds, the schedule and (given the measured ``median_us``) the time per wave beyond it.
    """
    parts = [f"{variant}: {cost.note}"]
    label = ROOF_LABELS[bound]
    if bound == "waves" and fraction <= 1.05:
        waves = cost.tile_launch.waves
        busy = cost.flops_exec / cost.flops_waves
        text = (f"whole-wave-bound at {fraction:.0%} ({cost.schedule} take {eng(times['waves'] * 1e-6, 's')} at "
                f"the tensor-core rate, {busy:.0%} of that SM time on tiles")
        if math.isfinite(median_us):
            others = cost.launches - 1
            text += (f"; {eng((median_us - times['waves']) / waves * 1e-6, 's')} a wave beyond it"
                     + (f", the call's other {others} launch{'es' if others > 1 else ''} included" if others else ""))
        parts.append(text + ")")
    elif bound == "launch" and fraction >= 0.5:
        parts.append(f"launch-bound ({times['launch']:.1f} us of launches, {fraction:.0%} of the call)")
    elif bound == "launch":
        memory = max(times.get("hbm", 0.0), times.get("l2", 0.0))
        parts.append(f"latency-bound: {eng(times['launch'] / fraction * 1e-6, 's')} per call against a "
                     f"{eng(times['launch'] * 1e-6, 's')} launch floor and {eng(memory * 1e-6, 's')} of memory "
                     f"traffic (serial work)")
    elif fraction > 1.05:
        parts.append(f"{label}-bound, yet {fraction:.1f}x faster than that roof (model or ceiling off)")
    else:
        parts.append(f"{label}-bound at {fraction:.0%} of the {label} roof")
    if source:
        parts.append(source)
    if math.isfinite(gap):
        x = f"{gap:.{0 if gap >= 10 else 1}f}x"
        if ideal_roof == "launch":
            parts.append(f"{x} the one-launch floor")
        elif gap < 1.5:
            parts.append(f"at the {ROOF_LABELS[ideal_roof]} roof")
        else:
            parts.append(f"{x} below the {ROOF_LABELS[ideal_roof]} roof")
    return "; ".join(parts)


def byte_source(cost: Cost, counted: dict | None) -> str:
    """Where the memory roofs' bytes come from, in words."""
    if counted is not None:
        return (f"memory roofs from the counters: {eng(counted['dram'], 'B')} DRAM, {eng(counted['l2'], 'B')} "
                f"served by the L2 slices (the model's SMs move {eng(cost.l2_bytes, 'B')})")
    merged = "" if cost.l2_shared <= 0 else (f", {eng(cost.l2_merged, 'B')} at the L2 slices with co-resident "
                                             f"blocks' identical reads merged")
    return f"memory roofs from the model: {eng(cost.hbm_bytes, 'B')} HBM, {eng(cost.l2_bytes, 'B')} L2 <-> SM{merged}"


def classify(df: pd.DataFrame, ceilings: Ceilings, counters: pd.DataFrame | None = None) -> pd.DataFrame:
    """Add the roofline columns (:data:`COLUMNS`) to a tidy results table.

    Rows need ``kernel``, ``variant`` (or ``path``), ``mode``, ``l2``, ``median_us`` and the
    shape columns of their kernel's cost model; rows of kernels without a model, and rows without
    a time, keep NaNs. Where ``counters`` (default: ``df`` itself, as a run's combined table)
    holds the run's counter comparison (``kdtree.bench.counters.compare`` rows), each profiled
    point's memory roofs use its counter bytes and its diagnosis ends with its counter figures.
    """
    for col in ("kernel", "mode", "l2", "median_us"):
        if col not in df.columns:
            raise ValueError(f"results table needs column {col!r}; it has {list(df.columns)}")
    from kdtree.bench.counters import counter_bytes, counter_notes, note_for_row

    notes = counter_notes(df if counters is None else counters)
    counted = counter_bytes(df if counters is None else counters)
    rows = []
    for rec in df.to_dict("records"):
        timed = isinstance(rec["median_us"], (int, float)) and math.isfinite(rec["median_us"])
        cost = cost_for_row(rec, ceilings.l2_bytes) if timed else None
        variant = rec.get("variant") if isinstance(rec.get("variant"), str) else rec.get("path", "")
        floor = {k: float(rec[k]) for k in ("floor_us", "floor_launches")
                 if isinstance(rec.get(k), (int, float)) and math.isfinite(rec[k])}
        clock = rec.get("sm_clock_mhz")
        clock = float(clock) if isinstance(clock, (int, float)) else math.nan
        point = {} if cost is None else classify_point(cost, ceilings, rec["median_us"], rec["mode"], rec["l2"],
                                                       str(variant), str(rec["kernel"]), note_for_row(counted, rec) or None,
                                                       **floor, sm_clock_mhz=clock)
        extra = note_for_row(notes, rec) if point else ""
        if extra:
            point["diagnosis"] += f"; {extra}"
        rows.append(point)
    extra = pd.DataFrame(rows, index=df.index, columns=list(COLUMNS))
    return pd.concat([df.drop(columns=[c for c in COLUMNS if c in df.columns]), extra], axis=1)


def roof_lines(ceilings: Ceilings, intensities: np.ndarray | None = None) -> pd.DataFrame:
    """Attainable FLOP/s per roof over a range of intensities (FLOP/byte), for plotting.

    Returns tidy rows: roof, intensity, flops. Memory roofs are bandwidth x intensity capped
    by the fastest compute rate; compute roofs are flat.
    """
    x = np.logspace(-2, 4, 121) if intensities is None else np.asarray(intensities, dtype=float)
    peak = np.nanmax([ceilings.tensor_flops, ceilings.fp32_flops])
    rows = []
    for roof, bw in (("hbm", ceilings.hbm_bw), ("l2", ceilings.l2_bw)):
        if math.isfinite(bw):
            rows += [{"roof": roof, "intensity": i, "flops": min(bw * i, peak)} for i in x]
    for roof, rate in (("tensor", ceilings.tensor_flops), ("fp32", ceilings.fp32_flops)):
        if math.isfinite(rate):
            rows += [{"roof": roof, "intensity": i, "flops": rate} for i in (x[0], x[-1])]
    return pd.DataFrame(rows)
