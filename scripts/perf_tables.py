"""Markdown tables for the perf log, each generated from one committed run.

    python scripts/perf_tables.py verify-grid results/verify_table_h200/49e9c69
    python scripts/perf_tables.py grid-waves results/verify_table_h200/d22219d
    python scripts/perf_tables.py trace-ends results/verify_attention_trace_h200/after_mask_fix/trace_tma_16_33_64_16384.npz
    python scripts/perf_tables.py moe results/moe/h200_05_0f96448
    python scripts/perf_tables.py ncu-kernels results/moe/t1_h200/ncu/ncu_moe_t1.csv
    python scripts/perf_tables.py counters results/counters_h200/d22219d
    python scripts/perf_tables.py moe-ab results/moe/ab_h200/bf84d0f/ab.log
    python scripts/perf_tables.py moe-trace results/moe/trace_h200/bf84d0f/trace_moe_T1.npz
    python scripts/perf_tables.py splits-ab results/splits_ab_h200/6560d1c/splits.csv
    python scripts/perf_tables.py impl-vs results/verify_table_h200/275852a
    python scripts/perf_tables.py grid-diff results/verify_table_h200/b7b0c86 results/verify_table_h200/a2e2347
    python scripts/perf_tables.py mode-probe results/mode_probe_h100/b7ddb06/modes.csv
    python scripts/perf_tables.py hbm-bar results/verify_table_h200/b6fc776
    python scripts/perf_tables.py moe-bar results/moe/h200_05_1da4148
    python scripts/perf_tables.py rn72-stalls results/ncu_stalls_h100/rn72_9b1b4a4/rn72_source.csv.gz
    python scripts/perf_tables.py first-pairs results/verify_attention_trace_h200/code_cold_a2e2347/before/read/trace_pair_1_33_64_4096.npz
    python scripts/perf_tables.py rn72-rule results/verify_attention_dev_h100/rn72_rows_a3f8683/dev.csv
    python scripts/perf_tables.py tail-moves results/verify_table_h100/da7c365 [0.05]

verify-grid: the verify-attention benchmark table (``scripts/verify_table.py``'s parquet and
meta.json in that folder) against the tree-verify targets: per group of shapes, how many points
reach the bar, with the fraction's minimum, median and maximum, all against the ceilings that
same run measured; then ``fused`` against ``cascade`` and against the first wgmma kernel.

grid-waves: the same table's ``fused`` rows against the cost model's whole-wave roof (the tensor
rate with whole waves of blocks counted), per head group and prefix.

trace-ends: a traced verify kernel's block start (to its first tile landed and first S issued)
and end (last P V done to the block's end), from ``scripts/trace_attention.py``'s records; where
the trace has entry records (the pair kernel's first instruction), the prologue before the start and
the block's whole life (entry to end).

moe: the 05 notebook's table (``05.parquet``, ``05.meta.json``, ``ceilings.json``): the bf16
layer's fraction of HBM bandwidth and its time per routing and T, the kernel path's stage
breakdown, the step model's validation and its best budgets per prefix.

ncu-kernels: one row per profiled launch of an Nsight Compute ``--csv`` export taken with
``--metrics`` (one row per launch and metric): its time, DRAM bytes read, DRAM throughput, the
share of its cycles the SMs were active, and its grid, for the metrics the export holds.

counters: ``kdtree profile``'s Nsight Compute table (``counters.parquet``): per launch its time, DRAM
bytes read against the cost model, L2 -> SM bytes, tensor-pipe activity, occupancy and FLOPs.

moe-ab, attention-ab: ``scripts/moe_ab.py``'s / ``scripts/attention_ab.py``'s output: per T (per
shape) the medians of both passes of each tree, and each tree's mean over the two against the first
tree's.

splits-ab: ``scripts/splits_ab.py``'s CSV (the fused kernel under a grid's plan, split count and
head/tail, and under today's ``launch_plan``, timed side by side): new over old time per group of
prefix lengths, and the shapes where the new plan lost.

impl-vs: a verify grid's ``pair`` rows (``fused_pair``, or ``fused`` in grids from before the
per-launch choice, when ``fused`` ran ``pair`` everywhere) against ``fused_tma_seq`` at the same
shapes, grouped by the schedule the cost model gives them (split count, the longest block's KV
tiles, the blocks against one wave of the SMs): where ``pair`` is the slower of the two, the rule
``kdtree.attention.sm90_impl`` is read from.

grid-vs: a verify grid's ``fused`` rows against ``fused_pair``'s, shape by shape, with the kernel
``fused`` ran and each row's SM clock.

attention-dev: ``scripts/attention_dev.py``'s CSV: each configuration per shape, its time over
``fused_tma_seq``'s.

grid-diff: two verify grids, configuration by configuration: new over old time at the shapes both
timed, and where new is slower by more than 2%; the kernels neither commit changed show how far
two runs drift apart.

ncu-details: the ``ncu_*.txt`` files of a folder, each Nsight Compute's details page of one
launch (sections and ``--metrics`` printed, not exported): the launch's time and clock, the L2 and
crossbar (L2 -> SM) throughput against their peaks, and the tensor pipe's activity, one column a
file.

pair-steady: a pair-kernel trace's steady-state intervals (``trace_attention.py``'s summary, which
its run printed too): per interval the median and p10-p90 over the traced blocks' pairs.

first-pairs: warpgroup 0 of a pair-kernel trace, its first pairs of tiles: the O rescale before
P_B V (no memory access, slow only while the code is fetched), P_B seen to P_B V issued, and P_A V
done to P_B V done.

moe-trace: the phases of one kimi_k2_ep8 layer call from ``scripts/trace_moe.py``'s records
(``trace_moe_T<T>.npz``), in microseconds from the router's first wait returning: the router's
blocks but its last, its last block (the finaliser), the permutation, each grouped GEMM's working
routed blocks (from their median wait's return to the last one's end) and all its blocks, the
combine; for a ``HANDOFF=1`` trace first the gap from the previous call's combine.

hbm-bar: a verify grid's HBM-bound ``fused`` points: the time 0.80 of the run's HBM bandwidth
allows beside the launch's whole-wave tensor roof (padding rows and waves counted), and how many
points the roof alone keeps from the bar.

tail-fit: a log as tail-model reads it, a ``scripts/tail_sweep.py`` CSV (several tail split
counts a shape) or a ``scripts/splits_ab.py`` CSV (new plan over old): ``launch_tiles``' three constants (block, partial and
combine cost in KV tile periods) fitted to its measured ratios by a grid search, the model's
error per shape with the constants in use and with the fit; from a sweep, also the plan each
picks at each shape and its measured time over the best plan's.

tail-form: ``launch_tiles``' constants fitted jointly to several logs that tail-fit reads, without
and with the combine's growth per wave of partial row sets; the rms error of each form on each log.

tail-moves: a verify grid's ``fused`` pair shapes whose head/tail plan today's ``choose_tail`` moves
(optionally at another ``_TAIL_MIN_GAIN``, and other ``launch_tiles`` constants, "block,partial,combine"
or "block,partial,combine,growth"; "" keeps the one in use): both plans and the modelled time ratio.

tail-grid: two verify grids, the second with head/tail launches: at its head/tail shapes
``fused``'s time ratio and ``cascade``'s (the two runs' drift).

tail-model: an ``attention_ab.py`` log of a head/tail tree against a uniform one: per shape the
plan, ``choose_tail``'s modelled time ratio and the measured one.

moe-bar: the 05 notebook's stage breakdown against the MoE layer's 0.75-of-HBM bar (T <= 65): per T the
time the bar allows, the time outside the two grouped GEMMs, and the fraction of HBM the GEMMs
stream at now against what the bar would need of them.

moe-read: ``scripts/moe_read_probe.py``'s CSV: the MoE grouped GEMM's weight read pattern against
the same bytes read contiguously per block and the grid-stride read probe, per rows a block.

rn72-stalls: Nsight Compute's source page of the rn72 kernel (``--page source --csv``, the SASS
with its warp-stall samples, as ``scripts/ncu_attention_stalls.sh`` saves it): warpgroup 0's and
warpgroup 1's samples per section of the tile loop, found by the loop's SASS landmarks (its
mbarrier waits by offset, the wgmma runs and waits, the warpgroup's OR, the P publish), and the
guarded regions (BSSY / BSYNC) between S^T's wait and the OR that every tile enters.

rn72-rule: ``scripts/rows_n72_ab.py`` CSVs against ``launch_plan``'s rn72 rule: per run and row
share, the shapes given rn72 with its time over the rows_m kernel the plan would otherwise run, and
the shapes left to that kernel, split by whether rn72 was faster there.

mode-probe: ``scripts/mode_probe.py``'s CSV: per shape and configuration the per-call times, split
by the SM clock read beside each call, and the calls held down by the power cap.
"""
from __future__ import annotations

import functools
import io
import json
import math
import re
import runpy
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from kdtree.bench.stepmodel import best_budget_statement


def _grid(run: str) -> tuple[pd.DataFrame, dict]:
    """A verify grid folder's table (its parquet) and metadata (its meta.json)."""
    folder = Path(run)
    return pd.read_parquet(next(folder.glob("*.parquet"))), json.loads(next(folder.glob("*.meta.json")).read_text())


def _spread(v: pd.Series) -> str:
    return f"{v.min():.2f} / {v.median():.2f} / {v.max():.2f}"


def verify_grid(run: str) -> str:
    """The issue bars over a verify grid's ``fused`` rows: per group of shapes, the points at or
    above the bar, then the same count with each dense-rate fraction taken at the point's own SM
    clock where it ran below ``roofline.CLOCK_NOTE_BELOW`` of the bf16 probe's (its fraction times
    the probe's clock over its sampled clock: a call that lowered the clock had a lower roof);
    then ``fused`` against the other configurations."""
    from kdtree.bench.roofline import CLOCK_NOTE_BELOW, at_clock

    d, meta = _grid(run)
    f = d[d.config == "fused"].copy()
    groups = [
        ("H = 64, B >= 4 or N >= 129 or P >= 16384", "frac_bf16", 0.80,
         (f.H == 64) & ((f.B >= 4) | (f.N >= 129) | (f.P >= 16384))),
        ("H = 64, B = 1, N in {33, 65}, P = 4096", "frac_bf16", 0.60,
         (f.H == 64) & (f.B == 1) & f.N.isin([33, 65]) & (f.P == 4096)),
        ("H in {8, 16, 32}, HBM-bound", "frac_hbm", 0.80, (f.H < 64) & (f.roof == "hbm")),
        ("H in {8, 16, 32}, bf16-bound", "frac_bf16", 0.65, (f.H < 64) & (f.roof == "bf16")),
    ]
    probe = meta.get("ceiling_bf16_clock_mhz")
    clock = (f"the bf16 probe's clock, {probe:.0f} MHz" if probe else
             f"the bf16 probe's clock, not recorded in this run, taken as its highest sampled clock, "
             f"{meta['sm_clock_max_mhz']:.0f} MHz")
    probe = probe or meta["sm_clock_max_mhz"]
    out = [f"From `{run}` ({meta['device']}, commit {meta['git_sha']}, default kernel "
           f"`{meta['default_fused_impl']}`, SM clock {meta['sm_clock_min_mhz']:.0f}-{meta['sm_clock_max_mhz']:.0f} "
           f"MHz during the timed work; ceilings measured in that run: HBM {meta['ceiling_hbm_bw'] / 1e12:.2f} TB/s, "
           f"dense bf16 {meta['ceiling_bf16_flops'] / 1e12:.0f} TFLOP/s; {meta['timing']}). At the point's clock: "
           f"the fraction times {clock}, over the point's median sampled clock, where that is below "
           f"{CLOCK_NOTE_BELOW:.0%} of it.", "",
           "| shapes (`fused`) | points | bar | at or above | fraction min / median / max | at or above at the "
           "point's clock | SM clock min / median / max (MHz) |", "|---|---|---|---|---|---|---|"]
    for i, (name, col, bar, mask) in enumerate(groups):
        g = f[mask]
        scaled = at_clock(g[col], g.sm_clock_mhz / probe)
        passed = "-" if col == "frac_hbm" else str(int((scaled >= bar).sum()))
        mhz = f"{g.sm_clock_mhz.min():.0f} / {g.sm_clock_mhz.median():.0f} / {g.sm_clock_mhz.max():.0f}"
        out.append(f"| {name} | {len(g)} | {bar:.2f} of {'HBM' if col == 'frac_hbm' else 'bf16'} | "
                   f"{int((g[col] >= bar).sum())} | {_spread(g[col]) if len(g) else '-'} | {passed} | {mhz} |")
        if i == 0:  # where the H = 64 points below the bar are
            miss = g[scaled < bar]
            long = miss[miss.P > 4096]
            gained = g[(scaled >= bar) & (g[col] < bar)]
            below = (f"Below the bar of the first group at the point's clock: {len(miss) - len(long)} at P <= 4096, "
                     f"{int((long.splits > 1).sum())} at longer prefixes run in KV splits, "
                     f"{int((long.splits == 1).sum())} at longer prefixes in one launch. At or above it only at "
                     f"their own clock: "
                     + ("; ".join(f"B={r.B} N={r.N} P={r.P} at {r.sm_clock_mhz:.0f} MHz" for r in gained.itertuples())
                        or "none") + ".")
        if i == 1:  # the two one-sequence points, each against its bar
            small = "Second group: " + "; ".join(
                f"N={r.N} {r.us:.1f} us, {getattr(r, col):.4f}" for r in g.sort_values("N").itertuples()) + "."
    key = ["B", "N", "H", "P"]
    fu = f.set_index(key).us
    out += ["", below, "", small, "", "| `fused` against | points | `fused` slower at | time ratio min / median / max |",
            "|---|---|---|---|"]
    for other in ("cascade", "fused_pair", "fused_tma_seq", "fused_wgmma"):
        o = d[(d.config == other) & d.us.notna()].set_index(key).us
        r = (fu / o).dropna()
        if r.empty:  # a grid from before that kernel existed
            continue
        out.append(f"| `{other}` | {len(r)} | {int((r > 1).sum())} | {_spread(r)} |")
    # The points where fused lost to cascade, each with both spreads, split counts and SM clocks.
    rows = f.merge(d[d.config == "cascade"], on=key, suffixes=("", "_c"))
    lost = rows[rows.us > rows.us_c]
    out += ["", "`fused` slower than `cascade`: " + ("; ".join(
        f"{r.B},{r.N},{r.H},{r.P}: {r.us:.1f} ({r.p20:.1f}-{r.p80:.1f}, {r.splits} splits, {r.sm_clock_mhz:.0f} MHz) "
        f"against {r.us_c:.1f} ({r.p20_c:.1f}-{r.p80_c:.1f}, {r.splits_c} splits, {r.sm_clock_mhz_c:.0f} MHz) us"
        for r in lost.itertuples()) or "none") + "."]
    return "\n".join(out)


def grid_waves(run: str) -> str:
    """The whole-wave roof over a verify grid's ``fused`` rows (``kdtree.bench.models``: one block
    per SM, so a launch takes at least its waves x its longest block's tiles at an SM's share of
    the run's dense rate): per head group and prefix, the fraction of the plain dense rate, the
    share of SM time the schedule fills with tiles, the fraction of the whole-wave roof, and the
    time per wave beyond that roof (medians); then a straight line through the one-split points'
    time per wave against their blocks' tiles (a block's cost beyond its tiles, and per tile)."""
    from kdtree.bench.models import verify_attention_cost

    d, meta = _grid(run)
    rate = meta["ceiling_bf16_flops"]
    f = d[(d.config == "fused") & d.us.notna()].copy()
    rows, fits = [], []
    for r in f.itertuples():
        c = verify_attention_cost("fused", batch=r.B, nodes=r.N, heads=r.H, prefix=r.P, impl=r.impl,
                                  splits=int(r.splits), layout=r.layout)
        roof, waves = c.flops_waves / rate * 1e6, c.tile_launch.waves
        fits.append(dict(splits=int(r.splits), tiles=c.tile_launch.block_tiles, wave_us=r.us / waves))
        rows.append(dict(heads=r.H == 64, P=r.P, dense=r.frac_bf16, filled=c.flops_exec / c.flops_waves,
                         of_roof=roof / r.us, rest=(r.us - roof) / waves))
    t = pd.DataFrame(rows).groupby(["heads", "P"], sort=False).agg(
        points=("dense", "size"), dense=("dense", "median"), filled=("filled", "median"), of_roof=("of_roof", "median"),
        rest=("rest", "median")).sort_index(ascending=[False, True])
    out = [f"From `{run}` ({meta['device']}, commit {meta['git_sha']}; `fused`, dense bf16 {rate / 1e12:.0f} "
           "TFLOP/s measured in that run; medians per group).", "",
           "| H | P | points | fraction of dense bf16 | SM time on tiles (whole waves) | fraction of the whole-wave roof "
           "| us a wave beyond it |", "|---|---|---|---|---|---|---|"]
    out += [f"| {'64' if h else '8, 16, 32'} | {p} | {r.points:.0f} | {r.dense:.2f} | {r.filled:.2f} | {r.of_roof:.2f} | {r.rest:.1f} |"
            for (h, p), r in t.iterrows()]
    one = pd.DataFrame([r for r in fits if r["splits"] == 1])
    a, b = np.polyfit(one.tiles, one.wave_us, 1)[::-1]
    err = one.wave_us / (a + b * one.tiles) - 1
    out += ["", f"One-split points ({len(one)}), time per wave against the longest block's tiles: {a:.1f} us + "
            f"{b:.2f} us a tile, within 6% at {int((err.abs() <= 0.06).sum())} of them (worst {err.min():+.0%} / "
            f"{err.max():+.0%})."]
    return "\n".join(out)


@functools.lru_cache(maxsize=None)
def _trace_module() -> dict:
    """``scripts/trace_attention.py``'s globals (its record parser), loaded once."""
    return runpy.run_path(str(Path(__file__).resolve().parent / "trace_attention.py"))


def _trace(npz: str) -> tuple[list[dict], float]:
    """A verify-kernel trace's blocks (per role, its (clock, event, tile) records) and SM clock (MHz)."""
    data = np.load(npz)
    return _trace_module()["parse_records"](data["raw"]), float(data["mhz"])


def _by_event(recs) -> dict[tuple[str, int], list[int]]:
    """Records grouped by (event, tile): their clocks, in recording order."""
    at: dict[tuple[str, int], list[int]] = {}
    for c, ev, t in recs:
        at.setdefault((ev, t), []).append(c)
    return at


def trace_ends(npz: str) -> str:
    """A traced verify kernel's block ends (``scripts/trace_attention.py``'s records): per traced
    block, from its trace start to its first tile landed and to its first S issued, from there to
    its last P V done (its tiles), and from its last P V done to its end, split at the epilogue's
    barrier and O's stores where the trace records them (us; medians over the blocks, min and
    max)."""
    blocks, mhz = _trace(npz)
    ends = []
    for roles in blocks:
        at = _by_event(r for recs in roles.values() for r in recs)
        if not at:  # a traced block id past the grid (ATT_TRACE_FIRST too large) records nothing
            continue
        def clocks(event, at=at):  # every record of the event, whatever its tile field
            return [c for (ev, _), cs in at.items() if ev == event for c in cs]

        t0 = min(clocks("start"))  # (its tile field: the global timer)
        # (the last P V done: the latest record, as the pair kernel's last tile records no tile of its own)
        row = {"start -> tile 0 landed": min(at[("landed", 0)]) - t0, "start -> S(0) issued": min(at[("s_issued", 0)]) - t0,
               "S(0) issued -> last P V done (the tiles)": max(clocks("pv_done")) - min(at[("s_issued", 0)]),
               "last P V done -> end": max(clocks("end")) - max(clocks("pv_done"))}
        if clocks("epi_sync"):  # (traces from the epilogue records on: its block barrier, O's stores issued)
            row |= {"last P V done -> both row sums in": max(clocks("epi_sync")) - max(clocks("pv_done")),
                    "both row sums in -> O stores issued": max(clocks("o_stored")) - max(clocks("epi_sync")),
                    "O stores issued -> end": max(clocks("end")) - max(clocks("o_stored"))}
        if clocks("entry"):  # (pair traces from 12ea8b5 on: the kernel's first instruction)
            row = {"entry -> start (prologue: Q landed; rn72 from 35ed306: tile 0 too)": t0 - min(clocks("entry"))} | row | {
                "entry -> end (the block's life)": max(clocks("end")) - min(clocks("entry"))}
        ends.append(row)
    if not ends:
        raise SystemExit(f"trace-ends: {npz} holds no traced block (was ATT_TRACE_FIRST past the grid?)")
    e = pd.DataFrame(ends) / mhz
    out = [f"From `{npz}` ({len(e)} traced blocks, {mhz:.0f} MHz):", "", "| interval | median us | min | max |",
           "|---|---|---|---|"]
    out += [f"| {k} | {v.median():.2f} | {v.min():.2f} | {v.max():.2f} |" for k, v in e.items()]
    return "\n".join(out)


def pair_steady(npz: str) -> str:
    """A pair-kernel trace's steady-state intervals (``summary`` of ``scripts/trace_attention.py``
    with impl ``pair``): median and p10-p90 (us) of each over the traced blocks' pairs."""
    blocks, mhz = _trace(npz)
    summary = _trace_module()["summary"](blocks, mhz, "pair")
    out = [f"From `{npz}` ({len(blocks)} traced blocks, {mhz:.0f} MHz; steady-state pairs):", "",
           "| interval | median us | p10 | p90 | pairs |", "|---|---|---|---|---|"]
    out += [f"| {k} | {np.median(v):.2f} | {np.percentile(v, 10):.2f} | {np.percentile(v, 90):.2f} | {v.size} |"
            for k, v in summary.items()]
    return "\n".join(out)


def first_pairs(npz: str, pairs: int = 4) -> str:
    """Warpgroup 0 of a pair-kernel trace (records from 0cce90f on), its first ``pairs`` pairs of
    tiles: P_B V's boxes seen -> O rescaled (128 multiplies, no memory access: slow only while the
    code is fetched), the other warpgroup's P_B seen -> P_B V issued, and P_A V done -> P_B V done
    (us; medians over the traced blocks, min and max)."""
    blocks, mhz = _trace(npz)
    rows = []
    for roles in blocks:
        at = _by_event(roles["wg0"])
        for j in range(pairs):
            a, b = 2 * j, 2 * j + 1
            if ("empty_wait", b) not in at:
                continue
            rows.append({"pair": j,
                         "P_B V boxes seen -> O rescaled": at[("empty_wait", b)][0] - at[("empty", b)][0],
                         "P_B seen -> P_B V issued": at[("pv_issued", b)][0] - at[("free_wait", b)][0],
                         "P_A V done -> P_B V done": at[("pv_done", b)][0] - at[("pv_done", a)][0]})
    if not rows:
        raise SystemExit(f"{npz}: no pair records with the rescale marks (traces from 0cce90f on)")
    e = pd.DataFrame(rows)
    cols = [c for c in e.columns if c != "pair"]
    out = [f"From `{npz}` (warpgroup 0 of {e.groupby('pair').size().max()} traced blocks, {mhz:.0f} MHz; "
           "median [min, max] us):", "", "| pair | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for j, g in e.groupby("pair"):
        v = g[cols] / mhz
        out.append(f"| {j} | " + " | ".join(f"{v[c].median():.2f} [{v[c].min():.2f}, {v[c].max():.2f}]" for c in cols)
                   + " |")
    return "\n".join(out)


def grid_diff(old: str, new: str) -> str:
    """Two verify grids (``scripts/verify_table.py`` folders) configuration by configuration: at the
    shapes both timed, new over old time (min / median / max) and where new is slower by more than
    2%, with each run's commit and SM clock range; a kernel neither commit changed shows the drift
    between the two runs."""
    (a, ma), (b, mb) = _grid(old), _grid(new)
    key = ["B", "N", "H", "P", "config"]
    m = a[a.us.notna()].merge(b[b.us.notna()], on=key, suffixes=("_o", "_n"))
    m["r"] = m.us_n / m.us_o
    clocks = "; ".join(f"{x['git_sha']}: SM clock {x['sm_clock_min_mhz']:.0f}-{x['sm_clock_max_mhz']:.0f} MHz"
                       for x in (ma, mb))
    out = [f"From `{old}` -> `{new}` ({ma['device']}; {clocks}; graph replay, median us):", "",
           "| configuration | shapes | new / old min / median / max | new slower by > 2% at |", "|---|---|---|---|"]
    for cfg, g in m.groupby("config", sort=False):
        out.append(f"| `{cfg}` | {len(g)} | {_spread(g.r)} | {int((g.r > 1.02).sum())} |")
    # The shapes where fused alone moved: slower by > 2% while cascade, the same kernels with the
    # prefix split off, stayed within 1% (what the runs' drift does not explain).
    by = m.set_index(key[:-1])
    if {"fused", "cascade"} <= set(m.config):
        f, c = by[by.config == "fused"], by[by.config == "cascade"].r
        alone = f[(f.r > 1.02) & (abs(c.reindex(f.index) - 1) <= 0.01)]
        if len(alone):
            out += ["", "`fused` alone slower by > 2% (`cascade` within 1%):", "",
                    "| B, N, H, P | splits (new) | `fused` old -> new us | new / old | `cascade` new / old |",
                    "|---|---|---|---|---|"]
            out += [f"| {', '.join(map(str, k))} | {r.splits_n:.0f} | {r.us_o:.1f} -> {r.us_n:.1f} | {r.r:.3f} "
                    f"| {c[k]:.3f} |" for k, r in alone.iterrows()]
    return "\n".join(out)


# The in-kernel split merge's trace records (branch wip/split-merge, cuda/attention_merge.cuh:
# event "empty", these in the tile field), in the order a block passes them.
MERGE_STEPS = {1000: "partials stored, own slice staged", 1001: "every split arrived", 1002: "every lse loaded",
               1003: "weights", 1004: "other slices landed"}


def merge_trace(npz: str) -> str:
    """The in-kernel merge's steps in a pair trace (warpgroup 0's thread 0 of each traced block):
    from its last P V done through each step to its end (us; medians over the blocks, min, max)."""
    blocks, mhz = _trace(npz)
    rows = []
    for roles in blocks:
        recs = roles["wg0"]
        t = {i: c for c, ev, i in recs if ev == "empty" and i in MERGE_STEPS}
        marks = [("last P V done", max(c for c, ev, _ in recs if ev == "pv_done"))]
        marks += [(MERGE_STEPS[i], t[i]) for i in sorted(t)] + [("end", max(c for c, ev, _ in recs if ev == "end"))]
        rows.append({f"{a} -> {b}": (cb - ca) / mhz for (a, ca), (b, cb) in zip(marks, marks[1:])})
    e = pd.DataFrame(rows)
    out = [f"From `{npz}` ({len(e)} traced blocks, warpgroup 0, {mhz:.0f} MHz):", "",
           "| step | median us | min | max |", "|---|---|---|---|"]
    out += [f"| {k} | {v.median():.2f} | {v.min():.2f} | {v.max():.2f} |" for k, v in e.items()]
    return "\n".join(out)


def counters(run: str) -> str:
    """``kdtree profile``'s ``counters.parquet`` (or its ``counters.csv`` where a device call brought
    only that back; Nsight Compute, one row per launch): time under
    ncu, DRAM bytes read against the cost model, the bytes the SMs received from the L2, the
    tensor pipe's active share, achieved occupancy, and the tensor FLOPs counted against the
    model's; for profiles that have them, the L2's and the crossbar's share of their peaks."""
    folder = Path(run)
    table = folder / "counters.parquet"
    d = pd.read_parquet(table) if table.exists() else pd.read_csv(folder / "counters.csv")
    meta = json.loads((folder / "counters.meta.json").read_text())
    busy = {"l2_pct_peak", "xbar_pct_peak"} <= set(d.columns)   # profiles from ebf1609 on
    cols = ["B, N, H, P", "variant", "kernel (splits)", "us", "DRAM read MB (model)", "L2 -> SM MB",
            "tensor pipe active", "achieved occupancy", "tensor FLOPs / model"]
    cols += ["L2 (% of peak)", "L2 -> SM crossbar (% of peak)"] if busy else []
    out = [f"From `{run}` ({meta.get('device', '?')}, commit {meta.get('git_sha', '?')}; Nsight Compute, one "
           "launch per row).", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in d.itertuples():
        flops = f"{r.tensor_flops / r.model_flops_exec:.2f}" if r.model_flops_exec else "-"
        out.append(f"| {r.batch}, {r.q_len}, {r.heads}, {r.prefix} | {r.variant} | {r.kernel_name} ({r.splits}) | "
                   f"{r.duration_us:.1f} | {r.dram_read / 1e6:.1f} ({r.model_dram_read / 1e6:.1f}) | "
                   f"{r.l2_read_sm / 1e6:.1f} | {r.hmma_active_pct:.1f}% | {r.occupancy_pct:.1f}% | {flops} |"
                   + (f" {r.l2_pct_peak:.1f}% | {r.xbar_pct_peak:.1f}% |" if busy else ""))
    return "\n".join(out)


def moe(run: str) -> str:
    folder = Path(run)
    d = pd.read_parquet(folder / "05.parquet")
    meta = json.loads((folder / "05.meta.json").read_text())
    ceil = json.loads((folder / "ceilings.json").read_text())
    m = d[(d.table == "moe") & (d.variant == "bf16")]
    tokens = sorted(m.tokens.unique())
    out = [f"From `{run}` ({meta['device']}, commit {meta['git_sha']}, SM clock {meta['sm_clock_mhz']:.0f} MHz; "
           f"HBM {ceil['hbm_bw'] / 1e12:.2f} TB/s measured in that call; `kimi_k2_ep8` layer, bf16 kernel path, "
           f"graph replay, L2 warm).", "",
           "| routing | " + " | ".join(f"T = {t:.0f}" for t in tokens) + " |", "|---" * (len(tokens) + 1) + "|"]
    for routing, g in m.groupby("routing", sort=False):
        g = g.set_index("tokens")
        out.append(f"| {routing} | " + " | ".join(
            f"{g.loc[t, 'median_us']:.1f} us, {g.loc[t, 'hbm_fraction']:.3f}" for t in tokens) + " |")
    b = d[(d.table == "breakdown") & (d.path == "kernels")]
    out += ["", "| stage (us) | " + " | ".join(f"T = {t:.0f}" for t in tokens) + " |",
            "|---" * (len(tokens) + 1) + "|"]
    for stage, g in b.groupby("stage", sort=False):
        g = g.set_index("tokens")
        out.append(f"| {stage} | " + " | ".join(f"{g.loc[t, 'median_us']:.1f}" if t in g.index else "-"
                                                for t in tokens) + " |")
    v = d[d.table == "validation"]
    within = int(((v.ratio - 1).abs() <= 0.15).sum())
    out += ["", f"Step model against the measured step: {within} of {len(v)} within 15% "
                f"(predicted / measured {v.ratio.min():.3f} to {v.ratio.max():.3f}).", "",
            "| preset | points | predicted / measured, min | max |", "|---|---|---|---|"]
    for preset, g in v.groupby("preset", sort=False):
        out.append(f"| {preset} | {len(g)} | {g.ratio.min():.3f} | {g.ratio.max():.3f} |")
    sp = d[d.table == "speedup"].dropna(axis=1, how="all")
    out += [""] + [line for prefix in sorted(sp.prefix.unique())
                   for line in best_budget_statement(sp[sp.prefix == prefix])]
    return "\n".join(out)


def moe_read(csv_path: str) -> str:
    """``scripts/moe_read_probe.py``'s CSV: per matrix and rows a block, the GEMM's read pattern
    against the same bytes read contiguously per block, and both against the grid-stride read
    probe over the same matrix (cold L2, graph replay)."""
    import pandas as pd

    d = pd.read_csv(csv_path)
    d[["matrix", "pattern"]] = d["config"].str.split(" ", n=2, expand=True)[[0, 1]]
    out = [f"From `{csv_path}` (one expert's matrix read, no math; cold L2, graph replay, median us):", "",
           "| matrix | rows a block | blocks | GEMM pattern us (TB/s) | contiguous us (TB/s) | pattern / contiguous "
           "| pattern, of the read probe |", "|---|---|---|---|---|---|---|"]
    for m, g in d.groupby("matrix", sort=False):
        probe = g[g["pattern"] == "read_probe"].iloc[0]
        rows = g[g["pattern"] == "rows"].set_index("blocks")
        cont = g[g["pattern"] == "contiguous"].set_index("blocks")
        for blocks, r in rows.iterrows():
            c = cont.loc[blocks]
            out.append(f"| {m} | {r['config'].split()[2]} | {blocks} | {r['us']:.1f} ({r['tbps']:.2f}) "
                       f"| {c['us']:.1f} ({c['tbps']:.2f}) | {r['us'] / c['us']:.3f} | {r['of_read_probe']:.2f} |")
        out.append(f"| {m} | read probe | {probe['blocks']} | {probe['us']:.1f} ({probe['tbps']:.2f}) | | | 1.00 |")
    return "\n".join(out)


def moe_bar(run: str, bar: float = 0.75, max_tokens: int = 65) -> str:
    """The 05 notebook's stage breakdown of the bf16 kernel path against the MoE layer's bar of
    ``bar`` x the run's HBM bandwidth, where the layer is memory-bound (T <= ``max_tokens`` on the
    EP8 shard): per T the time the bar allows for the layer's weight
    bytes, the layer's time outside its two grouped GEMMs as measured (the whole less the GEMM
    stages: the router, the permutation and the combine, less what overlaps), and the fraction of
    HBM the GEMMs stream at now against the fraction they would need for the layer to meet the
    bar with that outside time unchanged."""
    folder = Path(run)
    d = pd.read_parquet(folder / "05.parquet")
    meta = json.loads((folder / "05.meta.json").read_text())
    bw = json.loads((folder / "ceilings.json").read_text())["hbm_bw"]
    b = d[(d.table == "breakdown") & (d.path == "kernels") & (d.tokens <= max_tokens)]
    out = [f"From `{run}` ({meta['device']}, commit {meta['git_sha']}; `kimi_k2_ep8` layer, bf16 kernel path, "
           f"graph replay; HBM {bw / 1e12:.2f} TB/s measured in that call):", "",
           f"| T | layer us | weight MB | us at {bar:.2f} of HBM | us outside the GEMMs | GEMMs now, fraction of HBM "
           "| GEMMs needed for the bar |", "|---|---|---|---|---|---|---|"]
    for t, g in b.groupby("tokens"):
        g = g.set_index("stage")
        whole, nbytes = g.loc["whole", "median_us"], g.loc["whole", "weight_bytes"]
        gemm_us = g.loc["gate_up", "median_us"] + g.loc["down", "median_us"]
        gemm_bytes = g.loc["gate_up", "weight_bytes"] + g.loc["down", "weight_bytes"]
        allowed, outside = nbytes / (bar * bw) * 1e6, whole - gemm_us
        need = gemm_bytes / ((allowed - outside) * 1e-6) / bw if allowed > outside else math.inf
        need = ("met" if whole <= allowed else f"{need:.2f}" if need <= 1 else
                f"{need:.2f}: above the HBM rate, out of reach")
        out.append(f"| {t:.0f} | {whole:.1f} | {nbytes / 1e6:.1f} | {allowed:.1f} | {outside:.1f} | "
                   f"{gemm_bytes / (gemm_us * 1e-6) / bw:.2f} | {need} |")
    return "\n".join(out)


NCU_COLUMNS = {   # metric -> (column, scale)
    "gpu__time_duration.sum": ("us", 1e-3),
    "dram__bytes_read.sum": ("DRAM read (MB)", 1e-6),
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("DRAM % of peak", 1.0),
    "launch__grid_size": ("blocks", 1.0),
}


def ncu_kernels(csv: str) -> str:
    lines = [ln for ln in Path(csv).read_text().splitlines() if ln.startswith('"')]
    d = pd.read_csv(io.StringIO("\n".join(lines)), thousands=",")
    w = d.pivot_table(index=["ID", "Kernel Name"], columns="Metric Name", values="Metric Value", aggfunc="first")
    out = pd.DataFrame(index=w.index)
    for metric, (col, scale) in NCU_COLUMNS.items():
        if metric in w:
            out[col] = (w[metric].astype(float) * scale).round(1 if scale != 1.0 or "%" in col else 0)
    if {"sm__cycles_active.avg", "sm__cycles_elapsed.max"} <= set(w.columns):
        out["SMs active (% of cycles)"] = (100 * w["sm__cycles_active.avg"].astype(float)
                                           / w["sm__cycles_elapsed.max"].astype(float)).round(0)
    out = out.reset_index().rename(columns={"ID": "launch", "Kernel Name": "kernel"})
    cols = list(out.columns)
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    rows += ["| " + " | ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in r) + " |"
             for r in out.itertuples(index=False)]
    return f"From `{csv}`:\n\n" + "\n".join(rows)


# ncu details-page metric -> row label (the figures a launch's limiter is read from)
NCU_DETAILS = {
    "Duration": "duration",
    "SM Frequency": "SM clock",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor pipe active (% of active cycles)",
    "Compute (SM) Throughput": "compute (SM) throughput (% of peak)",
    "L2 Cache Throughput": "L2 throughput (% of peak)",
    "lts__t_sectors.avg.pct_of_peak_sustained_elapsed": "L2 sectors (% of peak)",
    "l1tex__m_xbar2l1tex_read_bytes.sum": "L2 -> SM bytes (crossbar)",
    "l1tex__m_xbar2l1tex_read_bytes.sum.per_second": "L2 -> SM rate (crossbar)",
    "l1tex__m_xbar2l1tex_read_bytes.sum.pct_of_peak_sustained_elapsed": "L2 -> SM (% of the crossbar's peak)",
}


def ncu_details(folder: str) -> str:
    """The ``ncu_*.txt`` details pages of ``folder`` (one launch each): the NCU_DETAILS rows, one
    column a file, each value with the unit ncu printed."""
    files = sorted(Path(folder).glob("ncu_*.txt"))
    cols = {}
    for f in files:
        vals = {}
        for ln in f.read_text().splitlines():
            m = re.match(r"^\s{4}(\S.*?)\s{2,}(\S+?)?\s+([\d,.]+)$", ln)
            if m and m.group(1).strip() in NCU_DETAILS:
                vals[m.group(1).strip()] = f"{m.group(3)} {m.group(2) or ''}".strip().replace(" %", "")
        cols[f.stem.removeprefix("ncu_")] = vals
    rows = ["| figure | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    rows += ["| " + label + " | " + " | ".join(c.get(metric, "-") for c in cols.values()) + " |"
             for metric, label in NCU_DETAILS.items()]
    return f"From `{folder}` (Nsight Compute details pages, one launch each):\n\n" + "\n".join(rows)


def ab(log: str) -> str:
    """``scripts/moe_ab.py`` / ``attention_ab.py`` output: per item the medians of both passes of
    each tree, and each tree's mean against the first tree's."""
    lines = Path(log).read_text().splitlines()
    head = lines[0].split()
    lead = 2 if head[1] == "experts" else 1                          # moe_ab has an experts column
    trees = [head[lead + 2 * i] for i in range(len(head[lead:]) // 4)]   # "name #1" per cell, both passes
    cols = ["T", "experts touched"] if lead == 2 else ["B, N, H, P"]
    cols += [f"{t} (us)" for t in trees] + [f"{t} / {trees[0]}" for t in trees[1:]]
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for ln in lines[1:]:
        tok = ln.split()
        if len(tok) != lead + 3 * 2 * len(trees):
            continue
        med = [float(tok[lead + 3 * i]) for i in range(2 * len(trees))]   # a cell is "median [p20, p80]"
        passes = [(med[i], med[len(trees) + i]) for i in range(len(trees))]
        mean = [(a + b) / 2 for a, b in passes]
        rows.append("| " + " | ".join(tok[:lead] + [f"{a:.1f} / {b:.1f}" for a, b in passes]
                                      + [f"{m / mean[0]:.3f}" for m in mean[1:]]) + " |")
    return f"From `{log}` (median of each pass, first / second):\n\n" + "\n".join(rows)


def _tail_ab(log: str):
    """An ``attention_ab.py`` log of a head/tail tree (first) against the uniform one (second):
    per shape (B, N, H, P, the head/tail plan, the measured time ratio: the means of both passes);
    the plan is ``choose_tail``'s with the head at the uniform count (no ``fewer``), as those runs had it.
    A ``tail_sweep.py`` CSV (``.csv``): per head/tail row, its plan and time over its shape's
    uniform one. A ``splits_ab.py`` CSV (``old_head`` column): per shape the new plan and its time
    over the old plan's, and the old plan last (the others yield no seventh item: the uniform
    launch at ``choose_splits``' count)."""
    from kdtree.attention import _FUSED_BM, choose_splits, choose_tail

    if log.endswith(".csv"):
        import pandas as pd

        d = pd.read_csv(log)
        if "old_head" in d:
            for r in d.itertuples():
                yield (r.B, r.N, r.H, r.P, SimpleNamespace(splits=r.new_splits, head=r.new_head,
                                                           tail_splits=r.new_tail_splits), r.new_over_old,
                       SimpleNamespace(splits=r.old_splits, head=r.old_head, tail_splits=r.old_tail_splits))
            return
        uniform = d[d["head"] == 0].set_index(["B", "N", "H", "P"])["us"]
        for r in d[d["head"] > 0].itertuples():
            yield (r.B, r.N, r.H, r.P, SimpleNamespace(splits=r.splits, head=r.head, tail_splits=r.tail_splits),
                   r.us / uniform[r.B, r.N, r.H, r.P])
        return
    for ln in Path(log).read_text().splitlines()[1:]:
        tok = ln.split()
        if len(tok) != 13:
            continue
        B, N, H, P = map(int, tok[0].split(","))
        rt = B * -(-(N * H) // _FUSED_BM)   # the plan as those runs had it: the head at the uniform count
        s, head, ts = choose_tail(rt, P + N, 132, choose_splits(rt, P + N, 132, B * N * H), fewer=False)
        yield B, N, H, P, SimpleNamespace(splits=s, head=head, tail_splits=ts), (
            (float(tok[1]) + float(tok[7])) / (float(tok[4]) + float(tok[10])))


def _tail_ratio(B, N, H, P, p, costs=None, base=None) -> float:
    """The plan's modelled time over ``base``'s, by default the uniform launch's at
    ``choose_splits``' count (the head may take fewer splits)."""
    from kdtree.attention import _FUSED_BM, choose_splits, launch_tiles

    rt = B * -(-(N * H) // _FUSED_BM)
    base = base or SimpleNamespace(splits=choose_splits(rt, P + N, 132, B * N * H), head=0, tail_splits=0)
    return (launch_tiles(rt, P + N, 132, p.splits, p.head, p.tail_splits, costs)
            / launch_tiles(rt, P + N, 132, base.splits, base.head, base.tail_splits, costs))


def tail_model(log: str) -> str:
    """``attention_ab.py`` of a head/tail tree (first) against the uniform one (second), both on
    the pair kernel: per shape the head/tail plan, the time ``choose_tail``'s model gives it over
    the uniform launch's, and the measured ratio (the means of both passes)."""
    out = [f"From `{log}` (head/tail over uniform; model: `attention.launch_tiles`, KV tile periods):", "",
           "| B, N, H, P | splits, head row tiles, tail splits | model | measured |", "|---|---|---|---|"]
    for B, N, H, P, p, meas, *base in _tail_ab(log):
        out.append(f"| {B}, {N}, {H}, {P} | {p.splits}, {p.head}, {p.tail_splits} | {_tail_ratio(B, N, H, P, p, None, *base):.2f} "
                   f"| {meas:.2f} |")
    return "\n".join(out)


def tail_moves(run: str, min_gain: str = "", costs: str = "") -> str:
    """A verify grid's ``fused`` rows on the pair kernel where today's ``choose_tail`` plans
    otherwise than the grid ran (with ``min_gain``, at that ``_TAIL_MIN_GAIN`` instead; with
    ``costs``, "block,partial,combine[,growth]", with those ``launch_tiles`` constants): both plans, the new
    one's modelled time over the old's (``launch_tiles``, KV tile periods) and the grid's time: the
    prediction a timed A/B of the change checks (``scripts/splits_ab.py``)."""
    from kdtree import attention as A

    with runpy.run_path(str(Path(__file__).resolve().parent / "attention_dev.py"))["tail_knobs"](min_gain, costs):
        d = pd.read_parquet(next(Path(run).glob("*.parquet")))
        out = [f"From `{run}` (`fused` on pair; (splits, head row tiles, tail splits), 132 SMs; "
               f"`_TAIL_MIN_GAIN` {A._TAIL_MIN_GAIN:g}; block, partial, combine, growth "
               f"{A._BLOCK_TILES:g}, {A._PARTIAL_TILES:g}, {A._COMBINE_TILES:g}, {A._COMBINE_GROWTH:g}):", "",
               "| B, N, H, P | as run | today | model new / old | us as run |", "|---|---|---|---|---|"]
        for r in d[(d.config == "fused") & (d.impl == "pair")].itertuples():
            rt, kv = r.B * -(-(r.N * r.H) // A._FUSED_BM), r.P + r.N
            old = (r.splits, r.head, r.tail_splits)
            new = A.choose_tail(rt, kv, 132, A.choose_splits(rt, kv, 132, r.B * r.N * r.H))
            if new != old:
                out.append(f"| {r.B}, {r.N}, {r.H}, {r.P} | {', '.join(map(str, old))} | {', '.join(map(str, new))} | "
                           f"{A.launch_tiles(rt, kv, 132, *new) / A.launch_tiles(rt, kv, 132, *old):.2f} | {r.us:.1f} |")
    return "\n".join(out)


def _tail_errors(runs, costs) -> list:
    """Modelled minus measured ratio of each of ``_tail_ab``'s runs under ``costs``."""
    return [_tail_ratio(B, N, H, P, p, costs, *base) - meas for B, N, H, P, p, meas, *base in runs]


def _fit_costs(runs, growing: bool = False) -> tuple:
    """The costs on a grid that minimise the squared errors over ``runs``: block 0.5-8, partial
    0-4, combine 0-16 (KV tile periods); ``growing``: block 0.5-6, partial 0-3, combine 0-8 and
    its growth per wave of partial row sets 0-6 (``launch_tiles``)."""
    import itertools

    if growing:
        grid = itertools.product([x / 2 for x in range(1, 13)], [x / 2 for x in range(0, 7)], range(0, 9),
                                 [x / 2 for x in range(0, 13)])
    else:
        grid = itertools.product([x / 2 for x in range(1, 17)], [x / 2 for x in range(0, 9)], range(0, 17))
    return min(grid, key=lambda c: sum(e * e for e in _tail_errors(runs, c)))


def tail_form(*logs: str) -> str:
    """The tail model's two forms fitted jointly to the measured ratios of ``logs`` (any that
    ``tail-fit`` reads): the constants in use, the first three fitted (no growth), and all four
    with the combine's growth per wave of partial row sets (``launch_tiles``); the rms error of each
    on each log and on all."""
    from kdtree import attention as A

    runs = {log: list(_tail_ab(log)) for log in logs}
    every = [r for rs in runs.values() for r in rs]
    forms = [(A._BLOCK_TILES, A._PARTIAL_TILES, A._COMBINE_TILES, A._COMBINE_GROWTH), _fit_costs(every),
             _fit_costs(every, True)]

    def rms(rs, costs):
        es = _tail_errors(rs, costs)
        return (sum(e * e for e in es) / len(es)) ** 0.5
    out = ["Model minus measured ratio, rms, of `launch_tiles` (KV tile periods: block, partial, combine, the "
           "combine's growth per wave of partial row sets) with the constants in use, and fitted to all logs at once "
           "(grid search), without and with the growth:", "",
           f"| log | ratios | in use {forms[0]} | fitted {forms[1]} | growing combine {forms[2]} |", "|---|---|---|---|---|"]
    for log, rs in list(runs.items()) + [("all", every)]:
        out.append(f"| {log if log == 'all' else f'`{log}`'} | {len(rs)} | "
                   + " | ".join(f"{rms(rs, c):.3f}" for c in forms) + " |")
    return "\n".join(out)


def tail_fit(log: str) -> str:
    """``launch_tiles``' block, partial and combine costs (KV tile periods) fitted to the measured
    head/tail over uniform ratios of ``log`` (least squares over a grid of values), the plans held
    as run; the model's error per shape with the constants in use and with the fit."""
    from kdtree import attention as A

    runs = list(_tail_ab(log))
    keep = (A._BLOCK_TILES, A._PARTIAL_TILES, A._COMBINE_TILES)

    now = _tail_errors(runs, keep)
    fit = _fit_costs(runs)
    after = _tail_errors(runs, fit)
    out = [f"From `{log}`: block, partial, combine (KV tile periods) in use {keep}, fitted {fit} "
           "(grid 0.5-8, 0-4, 0-16); model minus measured ratio:", "",
           "| B, N, H, P | splits, head row tiles, tail splits | measured | error in use | error fitted |",
           "|---|---|---|---|---|"]
    out += [f"| {B}, {N}, {H}, {P} | {p.splits}, {p.head}, {p.tail_splits} | {m:.2f} | {a:+.2f} | {b:+.2f} |"
            for (B, N, H, P, p, m, *_), a, b in zip(runs, now, after)]
    rms = [(sum(e * e for e in es) / len(es)) ** 0.5 for es in (now, after)]
    out += ["", f"rms error: {rms[0]:.3f} in use, {rms[1]:.3f} fitted; max |error| {max(map(abs, now)):.3f}, "
            f"{max(map(abs, after)):.3f}"]
    shapes: dict = {}
    for r in runs:
        shapes.setdefault(r[:4], []).append(r)
    if any(len(rs) > 1 for rs in shapes.values()):
        out += ["", "The plan each set of constants picks among those measured (the uniform launch unless a plan's "
                "modelled time saves `_TAIL_MIN_GAIN`), its measured time over the best one's:", "",
                "| B, N, H, P | best measured: tail splits, ratio | in use: tail splits, over best "
                "| fitted: tail splits, over best |", "|---|---|---|---|"]
        for key, rs in shapes.items():
            best = min(rs, key=lambda r: r[5])
            best = (best[4].tail_splits, best[5]) if best[5] < 1.0 else (0, 1.0)

            def pick(costs, rs=rs):
                r = min(rs, key=lambda r: _tail_ratio(*r[:5], costs))
                return (r[4].tail_splits, r[5]) if _tail_ratio(*r[:5], costs) <= 1.0 - A._TAIL_MIN_GAIN else (0, 1.0)
            cells = [f"{ts}, {m / best[1]:.3f}" for ts, m in (pick(keep), pick(fit))]
            out.append(f"| {', '.join(map(str, key))} | {best[0]}, {best[1]:.2f} | {cells[0]} | {cells[1]} |")
        out += ["", "(tail splits 0: the uniform launch)"]
    return "\n".join(out)


def tail_grid(old: str, new: str) -> str:
    """Two verify grids, the second with head/tail launches: at each shape whose ``fused`` call
    ran one (``tail_splits`` > 0), ``fused``'s new over old time, and ``cascade``'s (whose plan the
    change leaves as it was: how far the two runs drift apart there)."""
    import pandas as pd

    def grid(run):
        return pd.read_parquet(next(Path(run).glob("verify_table_*.parquet"))).set_index(["B", "N", "H", "P", "config"])

    o, n = grid(old), grid(new)
    out = [f"From `{old}` -> `{new}` (graph replay, cold L2, median us):", "",
           "| B, N, H, P | splits, tail splits | `fused` old -> new us | new / old | fraction of bf16 old -> new "
           "| `cascade` new / old |", "|---|---|---|---|---|---|"]
    for (B, N, H, P, c), r in n.iterrows():
        if c != "fused" or not r.get("tail_splits", 0):
            continue
        a, co, cn = o.loc[(B, N, H, P, c)], o.loc[(B, N, H, P, "cascade")], n.loc[(B, N, H, P, "cascade")]
        out.append(f"| {B}, {N}, {H}, {P} | {r.splits}, {r.tail_splits} | {a.us:.1f} -> {r.us:.1f} | "
                   f"{r.us / a.us:.3f} | {a.frac_bf16:.2f} -> {r.frac_bf16:.2f} | {cn.us / co.us:.3f} |")
    return "\n".join(out)


def moe_trace(npz: str) -> str:
    import numpy as np

    from kdtree.experts import chunk_tiles

    d = np.load(npz)
    T = int(Path(npz).stem.rsplit("T", 1)[1])
    t0 = int(d["router_mma"][:, 1].min())

    def us(v) -> float:
        return (int(v) - t0) / 1e3

    r = d["router_mma"]
    ends = np.sort(r[:, 2])
    fused = "permute" not in d.files                        # the router's finaliser permuted
    rows = [("router: every block but the last", us(r[:, 1].min()), us(ends[-2])),
            ("router: its last block (top k" + (", permutation)" if fused else ")"), us(ends[-2]), us(ends[-1]))]
    if not fused:
        rows.append(("permutation", us(d["permute"][0, 1]), us(d["permute"][0, 2])))
    for g in ("gate_up", "down"):
        b = d[g]
        # the shared expert's grid rows: recorded in the traces from ed04e7b on (its merged rows: 0),
        # before that one chunk of 8 nt tokens each (Kimi K2: top 8 of 384)
        chunks = int(d[f"chunks_{g}"]) if f"chunks_{g}" in d.files else -(-T // (8 * chunk_tiles(T, 8, 384)))
        work = b[((b[:, 2] - b[:, 0]) > 500) & ((b[:, 5] >> 16).astype(np.int64) >= chunks)]
        rows += [(f"{g}: routed blocks", us(np.median(work[:, 1])), us(work[:, 2].max())),
                 (f"{g}: every block ({len(b)})", us(b[:, 0].min()), us(b[:, 2].max()))]
    c = d["combine"]
    rows.append(("combine", us(c[:, 1].min()), us(c[:, 2].max())))
    if "prev_combine" in d.files:   # a HANDOFF=1 trace: the call before this one
        rows.insert(0, ("previous call's combine end -> router blocks' first start",
                        us(d["prev_combine"][:, 2].max()), us(r[:, 0].min())))
    out = ["| phase | from (us) | to (us) | span (us) |", "|---|---|---|---|"]
    out += [f"| {n} | {a:.2f} | {b:.2f} | {b - a:.2f} |" for n, a, b in rows]
    return f"From `{npz}` (T = {T}; us from the router's first wait returning):\n\n" + "\n".join(out)


def impl_vs(run: str, other: str = "fused_tma_seq") -> str:
    from kdtree.bench.models import verify_attention_cost

    d, meta = _grid(run)
    key = ["B", "N", "H", "P"]
    base = "fused_pair" if (d.config == "fused_pair").any() else "fused"
    f = d[(d.config == base) & d.us.notna()]
    m = f.merge(d[(d.config == other) & d.us.notna()][key + ["us"]], on=key, suffixes=("", "_o"))
    rows = []
    for r in m.itertuples():
        t = verify_attention_cost("fused", batch=r.B, nodes=r.N, heads=r.H, prefix=r.P, impl=r.impl,
                                  splits=int(r.splits), layout=r.layout).tile_launch
        rows.append(dict(splits=">= 8" if r.splits >= 8 else "< 8", tiles="<= 13" if t.block_tiles <= 13 else "> 13",
                         wave=">= 3/4" if t.blocks >= 0.75 * t.slots else "< 3/4", ratio=r.us / r.us_o))
    t = pd.DataFrame(rows)
    out = [f"From `{run}` ({meta['device']}, commit {meta['git_sha']}): `{base}` (`pair`) "
           f"time over `{other}`'s at the same shape, by the schedule of `pair`'s launch.", "",
           "| splits | KV tiles of the longest block | blocks, of one wave | points | `pair` slower at "
           "| ratio min / median / max |", "|---|---|---|---|---|---|"]
    for (sp, ti, wa), g in t.groupby(["splits", "tiles", "wave"]):
        out.append(f"| {sp} | {ti} | {wa} | {len(g)} | {int((g.ratio > 1).sum())} | {_spread(g.ratio)} |")
    return "\n".join(out)


def attention_dev(csv: str, base: str = "fused_tma_seq") -> str:
    """``scripts/attention_dev.py``'s CSV: each configuration's time, fractions and plan per shape,
    and its time over ``base``'s at the same shape."""
    d = pd.read_csv(csv)
    key = ["B", "N", "H", "P"]
    d = d.merge(d[d.config == base][key + ["us"]], on=key, suffixes=("", "_base"))
    out = [f"From `{csv}` (graph replay, cold L2, median us; fractions of the dense bf16 rate and the HBM "
           "bandwidth measured in that call):", "",
           f"| B, N, H, P | config | layout, tile rows, splits | us | bf16 | HBM | / `{base}` |",
           "|---|---|---|---|---|---|---|"]
    out += [f"| {r.B}, {r.N}, {r.H}, {r.P} | {r.config} | {r.layout}, {r.tile_rows}, {r.splits} | {r.us:.1f} | "
            f"{r.frac_bf16:.2f} | {r.frac_hbm:.2f} | {r.us / r.us_base:.2f} |" for r in d.itertuples()]
    return "\n".join(out)


def rn72_rule(*csvs: str) -> str:
    """``scripts/rows_n72_ab.py`` runs against ``launch_plan``'s rn72 rule: per run and row share
    (rn72's rows over 64-row tiles'), the shapes the rule gives rn72 with rn72's time over the rows_m
    kernel the plan would otherwise run, and the shapes it leaves to that kernel, split by whether
    rn72 was faster there (where that kernel was not timed, against pair, marked); with each group's
    rn72 launch sizes (blocks) and prefixes."""
    from kdtree.attention import launch_plan

    out = ["| run | row share | given rn72: shapes, rn72 / rows_m kernel min / median / max, rn72 blocks, P | "
           "left to rows_m, rn72 faster: the same | left to rows_m, rn72 slower: the same |", "|---|---|---|---|---|"]
    wrong = []
    for csv in csvs:
        d = pd.read_csv(csv)
        us = d.pivot_table(index=["B", "N", "H", "P"], columns="config", values="us")
        splits = d[d.config == "fused_rn72"].set_index(["B", "N", "H", "P"]).splits
        rows = []
        for (B, N, H, P), t in us.iterrows():
            kw = dict(batch=B, nodes=N, heads=H, kv_rows=P + N, num_sms=132)
            picked, rows_m = launch_plan("fused", **kw).impl, launch_plan("fused", layout="rows_m", **kw).impl
            base = f"fused_{rows_m}" if f"fused_{rows_m}" in t else "fused_pair"
            share = 72 * -(-N * H // 72) / (64 * -(-N * H // 64))
            blocks = B * -(-N * H // 72) * splits[(B, N, H, P)]
            rows.append((round(share, 2), picked == "rn72", t["fused_rn72"] / t[base], base != f"fused_{rows_m}",
                         blocks, P))
            if picked == "rn72" and rows[-1][2] >= 1:
                wrong.append(f"{csv}: B={B} N={N} H={H} P={P}")
        d = pd.DataFrame(rows, columns=["share", "given", "ratio", "vs_pair", "blocks", "P"])
        for share, g in d.groupby("share"):
            cells = []
            for sel in (g[g.given], g[~g.given & (g.ratio < 1)], g[~g.given & (g.ratio >= 1)]):
                mark = " (against pair where tma_seq runs)" if sel.vs_pair.any() else ""
                cells.append(f"{len(sel)}, {_spread(sel.ratio)}{mark}, {sel.blocks.min()}-{sel.blocks.max()}, "
                             f"{sel.P.min()}-{sel.P.max()}" if len(sel) else "0")
            out.append(f"| `{Path(csv).parent.name}` | {share:.2f} | " + " | ".join(cells) + " |")
    out += ["", "Given rn72 but timed slower: " + ("none" if not wrong else "; ".join(wrong))]
    return "\n".join(out)


def grid_vs(run: str, other: str = "fused_pair") -> str:
    """A verify grid's ``fused`` rows against ``other``'s, shape by shape, with the kernel ``fused``
    ran, the split count and the SM clock of each row (a ratio across clocks is marked)."""
    d, meta = _grid(run)
    key = ["B", "N", "H", "P"]
    o = d[(d.config == other) & d.us.notna()][key + ["us", "sm_clock_mhz"]]
    m = d[(d.config == "fused") & d.us.notna()].merge(o, on=key, suffixes=("", "_o"))
    out = [f"From `{run}` ({meta['device']}, commit {meta['git_sha']}; graph replay, cold L2, median us):", "",
           f"| B, N, H, P | `fused` runs | splits | `fused` us | `{other}` us | ratio | SM clock MHz |",
           "|---|---|---|---|---|---|---|"]
    for r in m.itertuples():
        same = r.sm_clock_mhz == r.sm_clock_mhz_o
        out.append(f"| {r.B}, {r.N}, {r.H}, {r.P} | {r.impl} | {r.splits} | {r.us:.1f} | {r.us_o:.1f} | "
                   f"{r.us / r.us_o:.3f}{'' if same else ' (clocks differ)'} | {r.sm_clock_mhz:.0f} / {r.sm_clock_mhz_o:.0f} |")
    return "\n".join(out)


def splits_ab(csv: str) -> str:
    d = pd.read_csv(csv)
    if "old_head" not in d:   # CSVs from before plans with a head/tail were compared: uniform plans
        d = d.assign(old_head=0, new_head=0, old_tail_splits=0, new_tail_splits=0)
    out = [f"From `{csv}` ({len(d)} shapes where the plan moved; the lower of two medians each):", "",
           "| P | shapes | new / old min / median / max | new slower at |", "|---|---|---|---|"]
    model = "model_new_over_old" in d
    if model:   # the model's ratio beside the measured one
        out[2:4] = ["| P | shapes | new / old min / median / max | model new / old min / median / max | new slower at |",
                    "|---|---|---|---|---|"]
    for p, g in list(d.groupby("P")) + [("all", d)]:
        out.append(f"| {p} | {len(g)} | {_spread(g.new_over_old)} | "
                   + (f"{_spread(g.model_new_over_old)} | " if model else "") + f"{int((g.new_over_old > 1).sum())} |")
    if model:   # per shape: both plans, the measured and the modelled ratio
        out += ["", "| B, N, H, P | old plan | new plan | old us | new us | new / old | model new / old |",
                "|---|---|---|---|---|---|---|"]
        out += [f"| {r.B}, {r.N}, {r.H}, {r.P} | {r.old_splits}, {r.old_head}, {r.old_tail_splits} | {r.new_splits}, "
                f"{r.new_head}, {r.new_tail_splits} | {r.old_us:.1f} | {r.new_us:.1f} | {r.new_over_old:.3f} | "
                f"{r.model_new_over_old:.2f} |" for r in d.itertuples()]
    lost = d[d.new_over_old > 1]
    out += ["", "Slower with the new plan: " + ("none" if lost.empty else "; ".join(
        f"B={r.B} N={r.N} H={r.H} P={r.P} ((splits, head, tail splits) ({r.old_splits}, {r.old_head}, "
        f"{r.old_tail_splits}) -> ({r.new_splits}, {r.new_head}, {r.new_tail_splits}), {r.new_over_old:.3f})"
        for r in lost.itertuples()))]
    return "\n".join(out)


def split_cost(csv: str) -> str:
    """``scripts/split_cost.py`` output: the call, its split launch alone, what the merge adds to the
    split launch, and the combine alone on partials already written."""
    d = pd.read_csv(csv)
    out = [f"From `{csv}` (graph replay, L2 flushed before each call, median us):", "",
           "| B, N, H, P | kernel | splits | call | split launch alone | call - split launch | of the call | "
           "combine alone | SM clock MHz |", "|---|---|---|---|---|---|---|---|---|"]
    for r in d.itertuples():
        out.append(f"| {r.B}, {r.N}, {r.H}, {r.P} | {r.impl} | {r.splits} | {r.whole_us:.1f} | {r.split_us:.1f} | "
                   f"{r.whole_us - r.split_us:.1f} | {(r.whole_us - r.split_us) / r.whole_us:.0%} | "
                   f"{r.combine_us:.1f} | {r.sm_clock_mhz:.0f} |")
    return "\n".join(out)


def hbm_bar(run: str, bar: float = 0.80) -> str:
    """A verify grid's HBM-bound ``fused`` points against the bar of ``bar`` x the run's HBM
    bandwidth: the time the bar allows beside the launch's whole-wave tensor roof
    (``kdtree.bench.models``: the rows its tiles compute, padding included, waves counted, at the
    run's dense rate). Where that roof is longer than the bar allows, no kernel on the same row
    tiles and split count reaches the bar, however fast its tiles."""
    from kdtree.bench.models import verify_attention_cost

    d, meta = _grid(run)
    rate = meta["ceiling_bf16_flops"]
    f = d[(d.config == "fused") & (d.roof == "hbm") & d.us.notna()]
    out = [f"From `{run}` ({meta['device']}, commit {meta['git_sha']}; `fused` at its HBM-bound points; HBM "
           f"{meta['ceiling_hbm_bw'] / 1e12:.2f} TB/s and dense bf16 {rate / 1e12:.0f} TFLOP/s measured in that run):", "",
           f"| B, N, H, P | tile rows, splits | us | fraction of HBM | us at {bar:.2f} of HBM | whole-wave tensor roof us "
           "| roof / bar |", "|---|---|---|---|---|---|---|"]
    over = 0
    for r in f.itertuples():
        c = verify_attention_cost("fused", batch=r.B, nodes=r.N, heads=r.H, prefix=r.P, impl=r.impl,
                                  splits=int(r.splits), layout=r.layout)
        allowed, roof = r.us * r.frac_hbm / bar, c.flops_waves / rate * 1e6
        over += roof > allowed
        out.append(f"| {r.B}, {r.N}, {r.H}, {r.P} | {r.tile_rows}, {r.splits} | {r.us:.1f} | {r.frac_hbm:.2f} | "
                   f"{allowed:.1f} | {roof:.1f} | {roof / allowed:.2f} |")
    out += ["", f"The whole-wave roof exceeds what the bar allows at {over} of {len(f)} points."]
    return "\n".join(out)


def mode_probe(csv: str) -> str:
    """``scripts/mode_probe.py``'s CSV (one row per call, the configurations alternating): per
    shape and configuration the median and p20-p80 of the calls, then split by the SM clock read
    beside each call (at the shape's highest reading, within 15 MHz, or below it), and how many
    calls the driver held down for its power cap."""
    d = pd.read_csv(csv)
    col = "config" if "config" in d else "variant"   # the first run (b7ddb06) named the column variant
    out = [f"From `{csv}` ({d.call.max() + 1} calls of each configuration, alternating; one-call graphs, L2 "
           "flushed; SM clock read through NVML beside each call):", "",
           "| B, N, H, P | configuration | median us (p20-p80) | at the top clock: calls, median us | "
           "below it: calls, median us | power-capped calls |", "|---|---|---|---|---|---|"]
    for shape, g in d.groupby("shape", sort=False):
        top = g.sm_mhz.max()
        for c, h in g.groupby(col, sort=False):
            hi, lo = h[h.sm_mhz >= top - 15].us, h[h.sm_mhz < top - 15].us
            cell = (lambda x: f"{len(x)}, {x.median():.1f}" if len(x) else "0, -")
            out.append(f"| {shape.replace(',', ', ')} | `{c}` | {h.us.median():.1f} ({h.us.quantile(0.2):.1f}-"
                       f"{h.us.quantile(0.8):.1f}) | {cell(hi)} (top {top} MHz) | {cell(lo)} | "
                       f"{int((h.reasons & 0x4 > 0).sum())} |")
    return "\n".join(out)


# rn72's mbarriers: RN72_OFF_BAR of cuda/verify_attention_rows_n72.cu (Q, two V stages, the rope
# box, P and alpha before them) and the offsets of FULL_HI[0], FULL_R and PFULL after it.
_RN72_BAR = 9 * 72 * 128 + 2 * 8 * 64 * 128 + 64 * 128 + 72 * 128 + 2 * 72 * 4
_RN72_WAITS = {"hi": _RN72_BAR + 16, "rope": _RN72_BAR + 32, "pfull": _RN72_BAR + 40}


def rn72_stalls(path: str) -> str:
    """Warp-stall samples of the rn72 kernel's tile loops by section (see the module's doc)."""
    import pandas as pd

    d = pd.read_csv(path, skiprows=1)
    src = d["Source"].str.strip().tolist()
    samples = d["Warp Stall Sampling (All Samples)"].astype(int).tolist()
    executed = d["Instructions Executed"].fillna(0).astype(int).tolist()
    total = sum(samples)

    def find(pattern, start):
        for i in range(start, len(src)):
            if re.search(pattern, src[i]):
                return i
        raise SystemExit(f"{path}: no SASS line matches {pattern!r} after line {start}")

    def loop_end(last_wait):  # the first line after a loop's last wait that runs about once a block, not a tile
        return next(i for i in range(last_wait, len(src)) if 0 < executed[i] < executed[last_wait] // 10)

    def wait(name):
        return rf"SYNCS\.PHASECHK\.TRANS64\.TRYWAIT .*\+{_RN72_WAITS[name]:#x}\]"

    depbar = r"WARPGROUP\.DEPBAR\.LE gsb0, 0x0"
    # Warpgroup 1's loop: the wait for P, its O^T wgmmas, their wait, the stage's release and refill.
    w1 = find(wait("pfull"), 0)
    w1_mma = find(r"HGMMA", w1)
    w1_dep = find(depbar, w1_mma)
    w1_end = loop_end(w1_dep)
    # Warpgroup 0's loop.
    w0 = find(wait("hi"), w1_end)
    s_mma = find(r"HGMMA", find(wait("rope"), w0))
    s_dep = find(depbar, s_mma)
    bar_red = find(r"BAR\.RED\.OR", s_dep)
    step_end = find(r"BAR\.SYNC\.DEFER_BLOCKING 0x1, 0x80", find(r"BAR\.SYNC\.DEFER_BLOCKING 0x1, 0x80", bar_red) + 1)
    pub = find(rf"SYNCS\.ARRIVE.*\+{_RN72_WAITS['pfull']:#x}\]", step_end)
    o_dep = find(depbar, pub)
    w0_end = loop_end(o_dep)
    sections = [
        ("wg1", "wait for P (wg0's publish)", w1, w1_mma),
        ("wg1", "O^T blocks 2-7: issue", w1_mma, w1_dep),
        ("wg1", "O^T blocks 2-7: wait", w1_dep, w1_dep + 1),
        ("wg1", "release, refill, loop", w1_dep + 1, w1_end),
        ("wg0", "wait for the tile's boxes (value, rope)", w0, s_mma),
        ("wg0", "S^T: issue (36 wgmma)", s_mma, s_dep),
        ("wg0", "S^T: wait", s_dep, s_dep + 1),
        ("wg0", "P free, scale, mask, OR over the warpgroup", s_dep + 1, bar_red + 2),
        ("wg0", "the full max step (tiles that move a shift)", bar_red + 2, step_end + 1),
        ("wg0", "exponentials, P stores, publish", step_end + 1, pub + 1),
        ("wg0", "O^T blocks 0-1: issue and wait", pub + 1, o_dep + 1),
        ("wg0", "refill, loop", o_dep + 1, w0_end),
    ]
    per_wg = {wg: sum(sum(samples[a:b]) for w, _, a, b in sections if w == wg) for wg in ("wg0", "wg1")}
    # guarded regions entered on every tile (a BSSY executed as often as S^T's wait), not only on edge tiles
    guarded = sum(bool(re.match(r"BSSY", src[i])) and executed[i] >= executed[s_dep] for i in range(s_dep, bar_red))
    out = [f"From `{path}` ({total} warp-stall samples; tile loops: warpgroup 0 {per_wg['wg0']}, warpgroup 1 "
           f"{per_wg['wg1']}; {executed[s_dep]} S^T waits executed):", "",
           "| warpgroup | section | samples | share of the warpgroup's loop |", "|---|---|---|---|"]
    for wg, name, a, b in sections:
        n = sum(samples[a:b])
        out.append(f"| {wg} | {name} | {n} | {n / per_wg[wg]:.3f} |")
    bssy = sum(samples[i] for i in range(s_dep, bar_red) if re.match(r"BS(SY|YNC)", src[i]))
    out += ["", f"Between S^T's wait and the OR: {guarded} guarded regions (BSSY) entered on every tile; the BSSY / "
            f"BSYNC lines there {bssy} samples ({bssy / per_wg['wg0']:.3f} of warpgroup 0's loop)."]
    return "\n".join(out)


if __name__ == "__main__":
    kinds = {"verify-grid": verify_grid, "grid-waves": grid_waves, "trace-ends": trace_ends, "moe": moe,
             "ncu-kernels": ncu_kernels, "counters": counters, "moe-ab": ab, "attention-ab": ab, "moe-trace": moe_trace,
             "splits-ab": splits_ab, "impl-vs": impl_vs, "attention-dev": attention_dev,
             "grid-vs": grid_vs, "split-cost": split_cost, "merge-trace": merge_trace, "first-pairs": first_pairs,
             "pair-steady": pair_steady, "ncu-details": ncu_details,
             "grid-diff": grid_diff, "mode-probe": mode_probe, "hbm-bar": hbm_bar, "moe-bar": moe_bar,
             "moe-read": moe_read,
             "tail-model": tail_model, "tail-grid": tail_grid, "tail-fit": tail_fit, "tail-form": tail_form,
             "tail-moves": tail_moves,
             "rn72-stalls": rn72_stalls,
             "rn72-rule": rn72_rule}
    two = {"grid-diff", "tail-grid"}   # kinds that read two runs
    many = {"rn72-rule", "tail-form"}   # kinds that read one run or more
    optional = {"attention-dev": 1, "tail-moves": 2}   # kinds that take up to so many arguments after the first
    n = len(sys.argv) - 3
    if n < 0 or sys.argv[1] not in kinds or not (n == (sys.argv[1] in two) or 0 < n <= optional.get(sys.argv[1], 0)
                                                 or sys.argv[1] in many):
        sys.exit(f"usage: perf_tables.py {{{'|'.join(kinds)}}} RUN_FOLDER_OR_CSV (grid-diff, tail-grid: OLD_RUN NEW_RUN; "
                 "attention-dev: CSV [BASE_CONFIG]; tail-moves: RUN [MIN_GAIN [COSTS]]; rn72-rule: CSV [CSV ...]; "
                 "tail-form: LOG [LOG ...])")
    print(kinds[sys.argv[1]](*sys.argv[2:]))
