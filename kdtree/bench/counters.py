"""Hardware counters against the cost model: every kernel under Nsight Compute, joined to its model.

``profile(points, out_dir)`` runs each point's call once under ``ncu`` (clocks left alone:
``--clock-control none``; every cache flushed before each kernel: ``--cache-control all``;
only the calls themselves profiled: ``--profile-from-start off`` around each), exports the
report with ``ncu --csv --page raw --print-units base`` and reads it with :func:`read_raw_csv`
(the raw page, never the text output). Per launch: duration, DRAM bytes read and written, L2
<-> SM bytes (``lts__t_sectors_srcunit_tex_*`` sectors), tensor-pipe work (bf16 tensor ops,
HMMA/GMMA instructions, pipe activity), achieved occupancy, registers and shared memory.

:func:`join_model` puts each launch beside the launch the cost model (``kdtree.bench.models``)
predicts for it, and :func:`compare` turns that into a tidy table, one row per call (and per
launch), figure and memory level: model, counter, ratio, tolerance and flag. DRAM bytes are
flagged beyond :data:`TOLERANCE` ``dram_bytes`` (10%), tensor FLOPs as executed beyond 5%;
the other levels are shown with a looser tolerance. :func:`roofline_points` places every
call on the hierarchical roofline from counter bytes, one point per memory level.

Points are mappings with ``kernel`` (``verify_attention``, ``build_tree``, ``accept_tree``,
``compact_kv``), ``variant`` (verify: ``fused``, ``fused_mma``, ``cascade``, ``naive``; build:
``parallel``, ``heap``; the rest ``gpu``) and the shape columns of the kernel's model.
``python -m kdtree.bench.counters PLAN.json`` is the program ncu runs: it builds each point's
inputs, checks the result, warms up, then runs one call between ``cudaProfilerStart`` and
``cudaProfilerStop``, and writes ``calls.json`` beside the plan.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from kdtree.bench.models import cost_for_row, kernel_name

# ncu metric -> (column, scale to the column's unit). Only the metrics this ncu knows are asked for.
METRICS = {
    "gpu__time_duration.sum": ("duration_us", 1e6),                       # s -> us
    "dram__bytes_read.sum": ("dram_read", 1.0),
    "dram__bytes_write.sum": ("dram_write", 1.0),
    "lts__t_sectors_srcunit_tex_op_read.sum": ("l2_read", 32.0),          # sectors -> bytes
    "lts__t_sectors_srcunit_tex_op_write.sum": ("l2_write", 32.0),
    "l1tex__m_xbar2l1tex_read_bytes.sum": ("l2_read_sm", 1.0),           # L2 -> SM as the SMs receive it
    "lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum": ("l2_read_hit", 32.0),
    "lts__t_sectors_srcunit_tex_op_write_lookup_hit.sum": ("l2_write_hit", 32.0),
    "sm__ops_path_tensor_src_bf16_dst_fp32.sum": ("tensor_ops", 1.0),
    "sm__inst_executed_pipe_tensor_op_hmma.sum": ("hmma_inst", 1.0),
    "sm__inst_executed_pipe_tensor_op_gmma.sum": ("gmma_inst", 1.0),
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": ("hmma_active_pct", 1.0),
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active": ("gmma_active_pct", 1.0),
    "sm__warps_active.avg.pct_of_peak_sustained_active": ("occupancy_pct", 1.0),
    "lts__t_sectors.avg.pct_of_peak_sustained_elapsed": ("l2_pct_peak", 1.0),           # L2 slices' throughput
    "l1tex__m_xbar2l1tex_read_bytes.sum.pct_of_peak_sustained_elapsed": ("xbar_pct_peak", 1.0),  # L2 -> SM crossbar
    "launch__registers_per_thread": ("registers", 1.0),
    "launch__shared_mem_per_block_dynamic": ("smem_dynamic", 1.0),
    "launch__shared_mem_per_block_static": ("smem_static", 1.0),
    "launch__grid_size": ("grid_size", 1.0),
    "launch__block_size": ("block_size", 1.0),
    "sm__cycles_elapsed.avg.per_second": ("sm_clock_mhz", 1e-6),          # Hz -> MHz
    "dram__cycles_elapsed.avg.per_second": ("dram_clock_mhz", 1e-6),
}
HMMA_FLOPS = 2 * 16 * 8 * 16       # one warp's mma.sync m16n8k16
TENSOR_OPS_FLOPS = 1.0             # FLOPs per counted bf16 tensor op (on an H200 the count equals
                                   # 4096 x the HMMA.16816 instructions of the mma.sync kernel)
KERNEL_FILTER = r"regex:^(verify_|build_tree|accept_tree|compact_kv)"
# Relative tolerance per figure; figures in FLAGGED are the workbook's targets.
TOLERANCE = {"dram_bytes": 0.10, "tensor_flops": 0.05, "dram_read": 0.10, "dram_write": 0.25,
             "l2_read": 0.10, "l2_served": 0.25, "l2_write": 0.25}
FLAGGED = ("dram_bytes", "tensor_flops")
SLACK_BYTES = 8 << 10              # byte differences below this are never flagged (a few sectors)
# DRAM figures of a call whose modelled and counted bytes are both under this are not judged:
# after ncu's cache flush a launch fetches its code and constants from DRAM (tens of KB for the
# tree kernels), which the model, counting data, leaves out.
DRAM_FLOOR = 256 << 10
_PREFIX = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "n": 1e-9, "u": 1e-6, "m": 1e-3}
_BASES = ("byte", "second", "hz", "cycle", "sector", "inst")
_TIME = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
_DEFAULT_UNITS = {"gpu__time_duration.sum": "ns"}   # when an export has no units row


def find_ncu() -> str | None:
    """Path of Nsight Compute's ``ncu`` (on PATH or under /usr/local/cuda/bin), or None."""
    found = shutil.which("ncu")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/ncu")
    return str(default) if default.exists() else None


def _scale(unit: str) -> float:
    if unit in _TIME:
        return _TIME[unit]
    if len(unit) > 1 and unit[0] in _PREFIX and unit[1:].lower() in _BASES:
        return _PREFIX[unit[0]]
    return 1.0


def _to_base(value: float, unit: str) -> float:
    """A value in ``unit`` (``Kbyte``, ``ns``, ``nsecond``, ``Ghz``, ``cycle/nsecond``...) in base units
    (byte, second, hz, cycle/second); units without an SI prefix are returned as they are."""
    num, _, den = unit.strip().partition("/")
    return value * _scale(num) / (_scale(den) if den else 1.0)


def _number(text: str) -> float:
    text = text.strip().replace(",", "")
    if text in ("", "n/a", "N/A"):
        return math.nan
    try:
        return float(text)
    except ValueError:
        return math.nan


def read_raw_csv(source: str | Path) -> pd.DataFrame:
    """Per-launch counters from an ``ncu --csv --page raw`` export.

    The export has a header row of metric names, a row of units, then one row per profiled
    launch. Values are converted to base units, then to this module's columns (:data:`METRICS`;
    times in microseconds, bytes, clocks in MHz), plus ``id`` (launch order), ``kernel_name``,
    ``tensor_flops`` and ``smem_bytes``.

    Parameters
    ----------
    source : path or str
        The CSV file, or its text.

    Returns
    -------
    DataFrame
        One row per launch, in launch order.
    """
    text = Path(source).read_text() if isinstance(source, Path) or (
        isinstance(source, str) and "\n" not in source and Path(source).exists()) else str(source)
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]   # ncu's own lines start with ==PROF==
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rows) < 2 or "Kernel Name" not in rows[0]:
        raise ValueError("source: not an ncu --csv --page raw export (no 'Kernel Name' header)")
    header, units, data = rows[0], rows[1], rows[2:]
    if units and units[header.index("Kernel Name")] != "":       # exported without a units row
        data, units = rows[1:], [_DEFAULT_UNITS.get(h, "") for h in header]
    out = []
    for r in data:
        rec = {"id": int(_number(r[header.index("ID")])), "kernel_name": r[header.index("Kernel Name")]}
        for metric, (col, scale) in METRICS.items():
            if metric in header:
                i = header.index(metric)
                rec[col] = _to_base(_number(r[i]), units[i] if i < len(units) else "") * scale
        out.append(rec)
    df = pd.DataFrame(out).sort_values("id").reset_index(drop=True)
    return _derived(df)


def _derived(df: pd.DataFrame) -> pd.DataFrame:
    """Tensor FLOPs as executed (from bf16 tensor ops, else from HMMA instructions) and shared
    memory per block."""
    nan = pd.Series(np.nan, index=df.index)
    if "tensor_ops" in df and df["tensor_ops"].notna().any():
        df["tensor_flops"] = df["tensor_ops"] * TENSOR_OPS_FLOPS
    else:
        df["tensor_flops"] = df.get("hmma_inst", nan) * HMMA_FLOPS
    if "hmma_inst" in df:
        df["hmma_flops"] = df["hmma_inst"] * HMMA_FLOPS
    df["smem_bytes"] = df.get("smem_dynamic", nan).fillna(0) + df.get("smem_static", nan).fillna(0)
    return df


# ---- the model side ----

def model_launches(call: dict, l2_bytes: float | None = None) -> list[dict]:
    """The cost model's launches of one call (a point with its recorded plan), as dicts with
    ``model_`` columns and the expected ``kernel_name``."""
    if kernel_name(str(call.get("kernel"))) == "verify_attention":
        if not call.get("partials"):
            call = call | {"partials": "float32"}  # recorded before the partials went bf16 (and named their dtype)
        if not call.get("kv_range"):
            call = call | {"kv_range": "full"}  # recorded before a block's range ended at its last node
    cost = cost_for_row(call, l2_bytes)
    if cost is None:
        raise ValueError(f"call: no cost model for kernel {call.get('kernel')!r}")
    out = []
    for part in cost.parts:
        for _ in range(part.count):
            out.append({"model_kernel": part.kernel, "model_flops_exec": part.flops_exec / part.count,
                        "model_dram_read": part.dram_read / part.count,
                        "model_dram_write": part.dram_write / part.count,
                        "model_l2_read": part.l2_read / part.count, "model_l2_write": part.l2_write / part.count,
                        "model_l2_shared": part.l2_shared / part.count,
                        "model_tensor": cost.compute == "tensor"})
    return out


def join_model(launches: pd.DataFrame, calls: list[dict], l2_bytes: float | None = None) -> pd.DataFrame:
    """Assign profiled launches (in order) to the calls that made them and add the model's columns.

    Parameters
    ----------
    launches : DataFrame
        From :func:`read_raw_csv`.
    calls : list of dict
        The profiled calls in order: point columns plus the recorded plan (``calls.json``).
    l2_bytes : float, optional
        The device's L2 size for the model (default the H200's).

    Returns
    -------
    DataFrame
        One row per launch: ``call`` (index), ``launch`` (index within the call), the call's
        columns, the counters and the ``model_*`` columns.

    Raises
    ------
    ValueError
        When the launches do not match the calls' modelled kernels in number or name.
    """
    rows, i = [], 0
    launches = launches.reset_index(drop=True)
    for c, call in enumerate(calls):
        for j, model in enumerate(model_launches(call, l2_bytes)):
            if i >= len(launches):
                raise ValueError(f"launches: {len(launches)} profiled, but call {c} ({call.get('kernel')} "
                                 f"{call.get('variant')}) expects more")
            got = launches.iloc[i].to_dict()
            if not str(got["kernel_name"]).startswith(model["model_kernel"]):
                raise ValueError(f"launches: launch {i} is {got['kernel_name']!r}, the model of call {c} "
                                 f"({call.get('kernel')} {call.get('variant')}) expects {model['model_kernel']!r}")
            rows.append({"call": c, "launch": j, **call, **got, **model})
            i += 1
    if i != len(launches):
        raise ValueError(f"launches: {len(launches) - i} profiled launches left over after {len(calls)} calls")
    return pd.DataFrame(rows)


def _nan(d: pd.DataFrame) -> pd.Series:
    return pd.Series(np.nan, index=d.index)


# Figure -> (counter expression, model expression) over a frame of launches. ``l2_read`` is what
# the SMs receive from the L2 (``l1tex__m_xbar2l1tex_read_bytes``: every block's own loads, what
# the code moves); ``l2_served`` what reaches the L2 slices (``lts__t_sectors_srcunit_tex``),
# after the L2 request coalescer merged identical reads that blocks issue at the same time, so
# anywhere between the model's merged floor (``l2_merged``) and its SM-side bytes.
_FIGURES = {
    "dram_bytes": (lambda d: d["dram_read"] + d["dram_write"], lambda d: d["model_dram_read"] + d["model_dram_write"]),
    "dram_read": (lambda d: d["dram_read"], lambda d: d["model_dram_read"]),
    "dram_write": (lambda d: d["dram_write"], lambda d: d["model_dram_write"]),
    "l2_read": (lambda d: d["l2_read_sm"] if "l2_read_sm" in d else _nan(d), lambda d: d["model_l2_read"]),
    "l2_served": (lambda d: d["l2_read"], lambda d: d["model_l2_read"]),
    "l2_write": (lambda d: d["l2_write"], lambda d: d["model_l2_write"]),
    "tensor_flops": (lambda d: d["tensor_flops"], lambda d: d["model_flops_exec"].where(d["model_tensor"], 0.0)),
}
_LEVEL = {"dram_bytes": "DRAM", "dram_read": "DRAM", "dram_write": "DRAM", "l2_read": "L2", "l2_served": "L2",
          "l2_write": "L2", "tensor_flops": "tensor"}
POINT_COLUMNS = ("kernel", "variant", "batch", "q_len", "heads", "prefix", "budget", "depth", "topk", "splits",
                 "layout", "impl")


def compare(joined: pd.DataFrame, per_launch: bool = True) -> pd.DataFrame:
    """Model against counters: one row per call (``launch`` = ``"all"``) and, with
    ``per_launch``, per launch, for every figure of :data:`TOLERANCE`.

    Columns: the point's columns, ``launch``, ``kernel_name``, ``figure``, ``level`` (DRAM, L2,
    tensor), ``model``, ``counter``, ``ratio`` (counter / model), ``tolerance``, ``flag``
    (``"over"``/``"under"`` when the counter exceeds / falls short of the model beyond the
    tolerance and by more than :data:`SLACK_BYTES` for byte figures; ``""`` otherwise),
    ``target`` (True for the flagged figures, :data:`FLAGGED`) and ``note`` (why, where the
    counters themselves show it: DRAM reads beyond the SMs' own loads are instruction fetch).
    """
    need = {"call", "launch", "kernel_name", "dram_read", "dram_write", "model_dram_read"}
    if not need <= set(joined.columns):
        raise ValueError(f"joined: needs columns {sorted(need)} (join_model's output)")
    keys = [c for c in POINT_COLUMNS if c in joined.columns]
    groups = [("all", g) for _, g in joined.groupby("call", sort=True)]
    if per_launch:
        groups += [(str(int(r["launch"])), joined.loc[[i]]) for i, r in joined.iterrows()]
    rows = []
    for launch, g in groups:
        first = g.iloc[0]
        base = {k: first[k] for k in keys} | {"call": int(first["call"]), "launch": launch,
                                               "kernel_name": "+".join(dict.fromkeys(g["kernel_name"])),
                                               "duration_us": float(g["duration_us"].sum())
                                               if "duration_us" in g else math.nan} | _busy(g)
        for fig, (meas, model) in _FIGURES.items():
            if fig not in TOLERANCE or (fig == "tensor_flops" and "tensor_flops" not in g) or (
                    fig == "l2_read" and "l2_read_sm" not in g):          # a profile made before the metric
                continue
            m, c = float(model(g).sum()), float(meas(g).sum(min_count=1))
            if fig == "tensor_flops" and m == 0 and not (c > 0):
                continue                                    # no tensor work, none counted
            rows.append(base | {"figure": fig, "level": _LEVEL[fig], "modelled": m, "counter": c,
                                "ratio": c / m if m > 0 else (math.inf if c > 0 else 1.0), "tolerance": TOLERANCE[fig],
                                "target": fig in FLAGGED} | _judge(fig, g, m, c))
    return pd.DataFrame(rows)


# How busy a call kept the units that bound a kernel (ncu percentages): the tensor pipe (of the
# SMs' active cycles), the L2 slices and the L2 -> SM crossbar (of their peaks over the launch).
BUSY = ("hmma_active_pct", "l2_pct_peak", "xbar_pct_peak")
SATURATED_PCT = 80.0   # a unit at or above this share of its peak is taken as the one that binds


def _busy(g: pd.DataFrame) -> dict:
    """The :data:`BUSY` percentages of launches ``g`` as one call: each launch weighted by its
    duration (launches or columns without the figure left out)."""
    out = {}
    for col in BUSY:
        if col in g and "duration_us" in g:
            v, w = g[col].astype(float), g["duration_us"].astype(float)
            ok = v.notna() & w.notna()
            if ok.any() and w[ok].sum() > 0:
                out[col] = float((v[ok] * w[ok]).sum() / w[ok].sum())
    return out


def busy_reading(row: dict) -> str:
    """What a call's :data:`BUSY` percentages say binds it: ``""`` without the three, else e.g.
    ``"tensor pipe active 57% of active cycles, L2 19% and L2 -> SM crossbar 14% of their peaks:
    none saturated, so the call waits on latency (loads asked for late, handoffs)"``."""
    vals = {c: row.get(c) for c in BUSY}
    if any(v is None or pd.isna(v) for v in vals.values()):
        return ""
    t, l2, xb = (float(vals[c]) for c in BUSY)
    text = (f"tensor pipe active {t:.0f}% of active cycles, L2 {l2:.0f}% and L2 -> SM crossbar {xb:.0f}% "
            "of their peaks: ")
    if max(l2, xb) >= SATURATED_PCT:
        return text + "the L2 path near saturation (bandwidth-bound)"
    if t >= SATURATED_PCT:
        return text + "the tensor pipe near saturation (compute-bound)"
    return text + "none saturated, so the call waits on latency (loads asked for late, handoffs)"


def _judge(fig: str, g: pd.DataFrame, m: float, c: float) -> dict:
    """``flag`` and ``note`` of one figure of a call (or launch) ``g``: modelled ``m``, counted ``c``."""
    tol = TOLERANCE[fig]
    slack = 0.0 if fig == "tensor_flops" else SLACK_BYTES
    lo = m
    if fig == "l2_served":                              # anywhere from the merged floor up to the SMs' bytes
        lo = m - float(g["model_l2_shared"].sum()) if "model_l2_shared" in g else m
    if math.isnan(c):
        return {"flag": "missing", "note": ""}
    if fig.startswith("dram") and max(m, c) < DRAM_FLOOR:
        return {"flag": "", "note": (f"not judged: {c / 1e3:.0f} KB counted against {m / 1e3:.0f} KB modelled, under "
                                     f"the {DRAM_FLOOR >> 10} KB floor (after the cache flush a launch fetches its "
                                     f"code and constants from DRAM, and writes back a few lines early; the model "
                                     f"counts data)")}
    flag = "over" if c - m > max(tol * m, slack) else "under" if lo - c > max(tol * lo, slack) else ""
    note = ""
    if fig == "l2_served" and lo < m:
        note = (f"the L2 slices served {c / m:.2f}x the SMs' modelled reads (between {lo / m:.2f}x, every "
                f"concurrent identical read merged by the L2 request coalescer, and 1x)")
    fetch = float((g["dram_read"] - g["l2_read"]).clip(lower=0).sum())
    if flag == "over" and fig in ("dram_bytes", "dram_read") and fetch > max(tol * m, slack):
        note = (f"{fetch / 1e3:.0f} KB more read from DRAM than the SMs' loads requested: instruction "
                f"and constant fetch after the cache flush (the model counts data)")
    back = float(g["dram_write"].sum() - g["model_dram_write"].sum()) if "model_dram_write" in g else 0.0
    if flag == "over" and fig in ("dram_bytes", "dram_write") and not note and back > max(tol * m, slack):
        note = (f"{back / 1e6:.3g} MB more written back to DRAM during the launch than the model spills: the L2 "
                f"writes dirty lines back before the launch's footprint fills it (the model spills only what "
                f"exceeds the L2, counting the copies its two partitions keep)")
    return {"flag": flag, "note": note}


def roofline_points(joined: pd.DataFrame) -> pd.DataFrame:
    """The hierarchical roofline from counters: per call and memory level (DRAM, L2), the
    counted tensor FLOPs (useful FLOPs from the model where the kernel does no tensor work)
    over the counted bytes at that level, and the achieved FLOP/s over the counted duration.

    Returns tidy rows: the point's columns, ``level``, ``bytes``, ``flops``, ``intensity``
    (FLOP/byte), ``achieved_tflops``, ``achieved_tbs``, ``duration_us``.
    """
    keys = [c for c in POINT_COLUMNS if c in joined.columns]
    rows = []
    for _, g in joined.groupby("call", sort=True):
        first = g.iloc[0]
        cost = cost_for_row(first.to_dict())
        t = float(g["duration_us"].sum()) * 1e-6
        counted = float(g["tensor_flops"].sum(min_count=1)) if "tensor_flops" in g else math.nan
        flops = counted if counted > 0 else (cost.flops if cost is not None else 0.0)
        for level, nbytes in (("DRAM", float((g["dram_read"] + g["dram_write"]).sum())),
                              ("L2", float((g["l2_read"] + g["l2_write"]).sum()))):
            rows.append({**{k: first[k] for k in keys}, "call": int(first["call"]), "level": level, "bytes": nbytes,
                         "flops": flops, "intensity": flops / nbytes if nbytes else math.nan,
                         "achieved_tflops": flops / t / 1e12 if t else math.nan,
                         "achieved_tbs": nbytes / t / 1e12 if t else math.nan, "duration_us": t * 1e6})
    return pd.DataFrame(rows)


# ---- points and the profiled program ----

def default_points(quick: bool = True) -> list[dict]:
    """The profiled points: every verify variant at B=1, N=33, H=64, P=4096 (and N=257 unless
    ``quick``), the tree build on both paths, accept and compaction at budget 64, batch 8. Unless
    ``quick``, ``fused`` also at a long-prefix batch (B=4, N=129, H=64, P=16384) and at the
    tensor-parallel shard's memory-bound shape (B=64, N=9, H=8, P=16384)."""
    verify = [dict(kernel="verify_attention", variant=v, batch=1, q_len=n, heads=64, prefix=4096)
              for n in ((33,) if quick else (33, 257)) for v in ("fused", "fused_mma", "cascade", "naive")]
    if not quick:
        verify += [dict(kernel="verify_attention", variant="fused", batch=b, q_len=n, heads=h, prefix=16384)
                   for b, n, h in ((4, 129, 64), (64, 9, 8))]
    tree = dict(batch=8, budget=64, depth=15, topk=64)
    return verify + [dict(kernel="build_tree", variant=v, **tree) for v in ("parallel", "heap")] + [
        dict(kernel=k, variant="gpu", **tree) for k in ("accept_tree", "compact_kv")]


def _check_point(p: dict) -> dict:
    k = kernel_name(str(p.get("kernel")))
    allowed = {"verify_attention": ("fused", "fused_mma", "cascade", "naive"), "build_tree": ("parallel", "heap"),
               "accept_tree": ("gpu",), "compact_kv": ("gpu",)}
    if k not in allowed:
        raise ValueError(f"points: kernel {p.get('kernel')!r} is not profiled; expected one of {sorted(allowed)}")
    if p.get("variant") not in allowed[k]:
        raise ValueError(f"points: {k} variant {p.get('variant')!r}; expected one of {allowed[k]}")
    return dict(p, kernel=k)


def _run_point(p: dict, gen) -> tuple[dict, callable]:
    """Inputs, check and the call of one point; returns (the call's recorded row, the call)."""
    import torch

    import kdtree
    from kdtree.bench import attention_sweep as att
    from kdtree.bench import tree_bench
    from kdtree.bench.models import launch_plan_columns
    from kdtree.tree import _launch_build, accept_reference, build_tree_reference

    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    if p["kernel"] == "verify_attention":
        B, N, H, P = int(p["batch"]), int(p["q_len"]), int(p["heads"]), int(p["prefix"])
        tree, pl, ((q, kv),) = att.make_sets(B, N, H, P, 1, dev, gen)
        att.check(p["variant"], q, kv, pl, tree)
        real = tree.depth[tree.depth >= 0]
        row = p | {"tree_visible": float((real + 1).float().mean())} | launch_plan_columns(
            p["variant"], batch=B, nodes=N, heads=H, kv_rows=P + N, num_sms=sms, impl=att.impl_of(p["variant"], dev))
        return row, lambda: att.call(p["variant"], q, kv, pl, tree)
    B, budget, depth = int(p["batch"]), int(p["budget"]), int(p["depth"])
    k = int(p.get("topk") or budget)
    lp, tok = tree_bench.draft_inputs(B, depth, k, dev)
    path = torch.full((B,), -1, dtype=torch.int32, device=dev)
    tree = _launch_build(lp, tok, budget, path=path, serial=p["variant"] == "heap")
    ref = build_tree_reference(lp, tok, budget)
    if not all(torch.equal(getattr(tree, f).cpu(), getattr(ref, f).cpu()) for f in ("tokens", "parents", "visibility")):
        raise AssertionError(f"build_tree differs from the reference at {p}")
    if p["kernel"] == "build_tree":
        want = 3 if p["variant"] == "heap" else 0
        if not bool((path == want).all()):
            raise AssertionError(f"build_tree {p['variant']}: paths taken {path.tolist()}, wanted {want}")
        serial = p["variant"] == "heap"
        return dict(p, topk=k), lambda: _launch_build(lp, tok, budget, serial=serial)
    target = tree_bench.agreeing_target(tree)
    acc = kdtree.accept_tree(tree, target)
    ref_acc = accept_reference(tree, target)
    if not all(torch.equal(getattr(acc, f).cpu(), getattr(ref_acc, f).cpu()) for f in ("indices", "length", "bonus")):
        raise AssertionError(f"accept_tree differs from the reference at {p}")
    if p["kernel"] == "accept_tree":
        return dict(p, topk=k), lambda: kdtree.accept_tree(tree, target)
    prefix = torch.full((B,), tree_bench.PREFIX, dtype=torch.int64, device=dev)
    kv = torch.randn(B, tree_bench.PREFIX + budget + 1, tree_bench.KV_DIM, device=dev).to(torch.bfloat16)
    row = dict(p, topk=k, accepted=float(acc.length.float().mean()), moved=tree_bench.moved_rows(acc))
    return row, lambda: kdtree.compact_kv(kv, prefix, acc, validate=False)


def run_plan(plan_path: str | Path) -> Path:
    """Run the points of ``plan_path`` (JSON: ``{"points": [...], "seed": int}``) as ncu's target:
    each point's call once between cudaProfilerStart/Stop, after its check and a warm-up.
    Writes ``calls.json`` (the recorded rows, in order) beside the plan and returns its path."""
    import torch

    plan = json.loads(Path(plan_path).read_text())
    gen = torch.Generator().manual_seed(int(plan.get("seed", 0)))
    calls = []
    for p in map(_check_point, plan["points"]):
        row, fn = _run_point(p, gen)
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        calls.append(row)
        print(f"profiled {row['kernel']} {row['variant']}", flush=True)
    out = Path(plan_path).with_name("calls.json")
    out.write_text(json.dumps(calls, indent=1) + "\n")
    return out


def available_metrics(ncu: str) -> set[str]:
    """Base names of the metrics this ncu offers on the first GPU (``ncu --query-metrics``)."""
    text = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120).stdout
    return {ln.split()[0] for ln in text.splitlines() if ln.strip() and re.match(r"^[a-z0-9_]+__", ln)}


def profile(points=None, out_dir: str | Path = "results/counters", *, ncu: str | None = None,
            timeout: float = 540.0, seed: int = 0) -> pd.DataFrame:
    """Profile ``points`` under ncu and return the launches joined to the model (``join_model``).

    Writes into ``out_dir``: ``plan.json``, ``calls.json``, ``counters.ncu-rep`` (the report),
    ``counters_raw.csv`` (its raw page) and ``counters.{parquet,csv,meta.json}`` (the joined
    table with the run's metadata).

    Raises
    ------
    ValueError
        A point that names an unknown kernel or variant or lacks a parameter (checked first).
    RuntimeError
        Without a CUDA GPU or without ncu, or when ncu fails (its output is in the message).
    """
    import torch

    from kdtree.bench.results import run_metadata, save_table

    if not isinstance(points, (list, type(None))) or not all(isinstance(p, dict) for p in points or []):
        raise ValueError("points: expected a list of point objects ({\"kernel\": ..., \"variant\": ..., ...})")
    points = [_check_point(p) for p in (points or default_points())]
    if not torch.cuda.is_available():
        raise RuntimeError("counters: no CUDA GPU here; Nsight Compute counters need the GPU host")
    ncu = ncu or find_ncu()
    if ncu is None:
        raise RuntimeError("counters: Nsight Compute (ncu) not found on PATH or in /usr/local/cuda/bin")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan = out / "plan.json"
    plan.write_text(json.dumps({"points": points, "seed": seed}, indent=1) + "\n")
    have = available_metrics(ncu)
    metrics = [m for m in METRICS if m.split(".")[0] in have] or list(METRICS)
    rep = out / "counters.ncu-rep"
    import kdtree

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(kdtree.__file__).resolve().parents[1])] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    cmd = [ncu, "--clock-control", "none", "--cache-control", "all", "--profile-from-start", "off",
           "--target-processes", "all", "-k", KERNEL_FILTER, "--metrics", ",".join(metrics), "-f",
           "-o", str(rep.with_suffix("")), sys.executable, "-m", "kdtree.bench.counters", str(plan)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if run.returncode != 0 or not rep.exists():
        raise RuntimeError(f"counters: ncu failed ({run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    raw = subprocess.run([ncu, "-i", str(rep), "--csv", "--page", "raw", "--print-units", "base"],
                         capture_output=True, text=True, timeout=120)
    if raw.returncode != 0:
        raise RuntimeError(f"counters: ncu --import failed:\n{raw.stderr[-3000:]}")
    (out / "counters_raw.csv").write_text(raw.stdout)
    calls = json.loads((out / "calls.json").read_text())
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    joined = join_model(read_raw_csv(raw.stdout), calls, l2)
    meta = run_metadata() | {"ncu": subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip()
                             .splitlines()[-1], "ncu_options": "--clock-control none --cache-control all",
                             "metrics": metrics}
    save_table(joined, out / "counters", meta)
    return joined


def load_export(folder: str | Path, l2_bytes: float | None = None) -> pd.DataFrame:
    """Join a profile's export again from its sources: ``counters_raw.csv`` (the ncu raw page)
    and ``calls.json`` in ``folder`` (the joined table is derived, so a model change shows)."""
    folder = Path(folder)
    for name in ("counters_raw.csv", "calls.json"):
        if not (folder / name).exists():
            raise ValueError(f"counters_path: {folder} has no {name} (a `kdtree profile --out` folder)")
    calls = json.loads((folder / "calls.json").read_text())
    return join_model(read_raw_csv(folder / "counters_raw.csv"), calls, l2_bytes)


NO_GPU = ("No CUDA GPU or no Nsight Compute (ncu) here: nothing was profiled. On the GPU host this "
          "notebook runs every kernel under ncu (as `kdtree profile` does) and compares the counters "
          "with the cost model; give `counters_path` a profile's folder to read one made elsewhere.")


def notebook_inputs(counters_path: str = "", out_dir: str | Path = "", full: bool = False,
                    ceilings_path: str = ""):
    """What the counters notebook shows: ``(joined, ceilings, source)``.

    With ``counters_path``: that profile folder's export, joined again, and the ceilings saved
    beside it (``ceilings.json``, else the run's). Otherwise, on a GPU host with ncu: a fresh
    profile of the default points into ``out_dir``. Otherwise ``joined`` is None and ``source``
    is :data:`NO_GPU`.
    """
    import torch

    from kdtree.bench.ceilings import Ceilings, get_ceilings

    if counters_path:
        beside = Path(counters_path) / "ceilings.json"
        ceilings = Ceilings.load(beside) if beside.exists() else get_ceilings(ceilings_path or None, quick=True)
        return load_export(counters_path, ceilings.l2_bytes), ceilings, f"profile read from {counters_path}"
    if not torch.cuda.is_available() or find_ncu() is None:
        return None, get_ceilings(ceilings_path or None, quick=True), NO_GPU
    ceilings = get_ceilings(ceilings_path or None, quick=True)
    joined = profile(default_points(quick=not full), out_dir or "results/counters")
    return joined, ceilings, f"profiled now under ncu into {out_dir}"


def counter_notes(table: pd.DataFrame) -> dict:
    """Short counter summaries keyed like result rows, for the roofline's diagnosis text.

    ``table`` holds :func:`compare` rows (a run's combined table may hold them beside timed
    rows: those with a ``figure``); keys are (kernel, variant, batch, q_len, heads, prefix) for
    verify attention and (kernel, variant, batch, budget) for the tree kernels, with the tree
    benchmark's variant names (``gpu`` for the build's parallel path, ``gpu_heap``).
    """
    if table is None or not {"figure", "counter", "launch", "call"} <= set(table.columns):
        return {}
    d = table[table["figure"].notna() & (table["launch"].astype(str) == "all")]
    out = {}
    for _, g in d.groupby("call", sort=False):
        first = g.iloc[0]
        key = _note_key(first.to_dict())
        if key is None:
            continue
        parts = []
        for fig, label in (("dram_bytes", "DRAM"), ("l2_read", "L2->SM"), ("l2_served", "L2 served"),
                           ("tensor_flops", "tensor")):
            r = g[g["figure"] == fig]
            if len(r):
                r = r.iloc[0]
                unit, scale = ("GFLOP", 1e9) if fig == "tensor_flops" else ("MB", 1e6)
                floor = str(r.get("note", "")).startswith("not judged")
                parts.append(f"{label} {r['counter'] / scale:.3g} {unit} = {r['ratio']:.2f}x the model"
                             + (" (flagged)" if r["flag"] and r["target"] else "")
                             + (f" (not judged under {DRAM_FLOOR >> 10} KB: code fetch)" if floor else ""))
        busy = busy_reading(first.to_dict())
        out[key] = "counters (ncu, L2 flushed): " + ", ".join(parts) + (f"; {busy}" if busy else "")
    return out


def counter_bytes(table: pd.DataFrame) -> dict:
    """Counted bytes per profiled point, keyed like :func:`counter_notes`, for the roofline:
    ``dram`` (DRAM read + written, every launch on a flushed L2) and ``l2`` (what the L2 slices
    served and took: ``lts__t_sectors_srcunit_tex`` reads and writes). Tables made before the
    SM-side L2 figure existed (a ``model`` column) held the slices' reads as ``l2_read``."""
    if table is None or not {"figure", "counter", "launch", "call"} <= set(table.columns):
        return {}
    served = "l2_served" if "modelled" in table.columns else "l2_read"
    d = table[table["figure"].notna() & (table["launch"].astype(str) == "all")]
    out = {}
    for _, g in d.groupby("call", sort=False):
        key = _note_key(g.iloc[0].to_dict())
        got = dict(zip(g["figure"], g["counter"].astype(float)))
        if key is not None and {"dram_bytes", served, "l2_write"} <= set(got):
            out[key] = {"dram": got["dram_bytes"], "l2": got[served] + got["l2_write"]}
    return out


_BENCH_VARIANT = {("build_tree", "parallel"): "gpu", ("build_tree", "heap"): "gpu_heap"}


def _note_key(row: dict):
    k = kernel_name(str(row.get("kernel")))
    variant = str(row.get("variant"))
    try:
        if k == "verify_attention":
            return (k, variant, int(row["batch"]), int(row["q_len"]), int(row["heads"]), int(row["prefix"]))
        return (k, _BENCH_VARIANT.get((k, variant), variant), int(row["batch"]), int(row["budget"]))
    except (KeyError, TypeError, ValueError):
        return None


def note_for_row(notes: dict, row: dict) -> str:
    """The entry of ``notes`` (from :func:`counter_notes` or :func:`counter_bytes`) for a result
    row (``""`` when the run profiled no such point)."""
    if not notes:
        return ""
    values = dict(row)
    if kernel_name(str(values.get("kernel"))) in ("accept_tree", "compact_kv") and values.get("variant") != "gpu":
        return ""
    key = _note_key(values)
    return notes.get(key, "") if key is not None else ""


def roofline_figure(points: pd.DataFrame, ceilings, title: str):
    """The hierarchical roofline as Nsight Compute draws it: the HBM and L2 roofs and the compute
    roofs of ``ceilings``, and per profiled call one marker per memory level (the counter bytes
    at that level), joined by a line, at the counted FLOP/s. Calls without FLOPs are left out."""
    import plotly.graph_objects as go

    from kdtree.bench.plots import label, row_text
    from kdtree.bench.roofline import ROOF_LABELS, roof_lines

    fig = go.Figure()
    for roof, g in roof_lines(ceilings).groupby("roof", sort=False):
        fig.add_trace(go.Scatter(x=g["intensity"], y=g["flops"] / 1e12, mode="lines", name=f"{ROOF_LABELS[roof]} roof",
                                 line={"color": "gray", "dash": {"hbm": "dash", "l2": "dot"}.get(roof, "solid")}))
    d = points[points["flops"] > 0]
    keys = [c for c in POINT_COLUMNS if c in d.columns and d[c].notna().any()]
    for _, g in d.groupby("call", sort=True):
        name = row_text(g.iloc[:1], [k for k in keys if k != "kernel"]).iat[0]
        fig.add_trace(go.Scatter(x=g["intensity"], y=g["achieved_tflops"], mode="lines+markers+text", name=name,
                                 text=list(g["level"]), textposition="top center",
                                 marker={"symbol": ["circle" if lv == "DRAM" else "diamond" for lv in g["level"]],
                                         "size": 9}))
    fig.update_xaxes(title="FLOP per byte at the level (counters)", type="log")
    fig.update_yaxes(title="TFLOP/s (counted FLOPs / counted duration)", type="log")
    return label(fig, title, ceilings, d.assign(l2="flushed", mode="ncu"))


if __name__ == "__main__":
    run_plan(sys.argv[1])
