"""The fused kernel under the plan a committed verify grid ran (split count, head/tail) and under
today's ``launch_plan`` choice, side by side in one process, where the two differ (GPU host).

    python scripts/splits_ab.py results/verify_table_h200/<sha> OUT.csv ["B,N,H,P;..." [MIN_GAIN [COSTS]]]

At each such shape: fresh random inputs (``attention_dev.input_sets``: cold L2), both plans
checked against float64, then timed by CUDA-graph replay, old and new alternating twice (the
lower of each plan's two medians), with the time ``choose_tail``'s model (``launch_tiles``)
gives the new plan over the old. A plan is forced as ``attention_dev.forced_plan`` does: a
uniform one by its split count, a head/tail one (the pair kernel) through ``choose_tail``.
Shapes where the grid's ``fused`` lost to ``cascade`` first, then the cheapest; one CSV row per
shape, written as it is measured (a run cut short keeps what it measured); a summary line last.
A third argument keeps only the shapes it lists ("" for all); a fourth sets ``_TAIL_MIN_GAIN``
for today's plans (the A/B of a lower threshold), a fifth ``launch_tiles``' constants,
"block,partial,combine[,growth]" (the A/B of a refitted model; ``perf_tables.py tail-form``); ""
keeps the one in use, and each row records both.
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import pandas as pd
import torch

from attention_dev import check_config, forced_plan, input_sets, references, run_config, tail_knobs, time_configs
from kdtree import attention
from kdtree.attention import _FUSED_BM, _num_sms, launch_plan, launch_tiles


def _checked_us(plan, shape, tree, pl, sets, o, refs) -> float:
    """The median us of a fused call under ``plan`` (splits, head, tail_splits), once its output
    agreed with the float64 references (else the run stops)."""
    impl, got = "pair" if plan[1] else None, []
    forced_plan(plan, lambda s: run_config("fused", tree, pl, *sets[0], o, splits=s, impl=impl))()
    _, wrong = check_config(refs, o)
    if wrong:
        sys.exit(f"{shape} (splits, head, tail_splits)={plan}: {wrong}")
    forced_plan(plan, lambda s: got.append(time_configs([("fused", impl, s)], tree, pl, sets, o, reps=5)[0]))()
    return got[0].median_us


def main(grid: str, out: str, shapes: str = "", min_gain: str = "", costs: str = "") -> None:
    with tail_knobs(min_gain, costs):
        _ab(grid, out, shapes)


def _ab(grid: str, out: str, shapes: str) -> None:
    d = pd.read_parquet(next(Path(grid).glob("*.parquet")))
    sms, l2 = _num_sms(0), torch.cuda.get_device_properties(0).L2_cache_size
    gen = torch.Generator().manual_seed(11)
    rows, f, w = [], open(out, "w", newline=""), None
    fused = d[d.config == "fused"].set_index(["B", "N", "H", "P"])
    cascade = d[d.config == "cascade"].set_index(["B", "N", "H", "P"]).us.reindex(fused.index)
    # Shapes where fused lost to cascade first, then the cheapest
    order = pd.DataFrame({"lost": ~(fused.us > cascade), "work": fused.eval("B * N * H * (P + N)")}).reset_index()
    fused = fused.reset_index().iloc[order.sort_values(["lost", "work"]).index]
    only = {tuple(int(v) for v in sh.split(",")) for sh in shapes.split(";") if sh}
    for r in fused.itertuples():
        if only and (r.B, r.N, r.H, r.P) not in only:
            continue
        p = launch_plan("fused", batch=r.B, nodes=r.N, heads=r.H, kv_rows=r.P + r.N, num_sms=sms)
        old, new = (r.splits, getattr(r, "head", 0), getattr(r, "tail_splits", 0)), (p.splits, p.head, p.tail_splits)
        if new == old:
            continue
        tree, pl, sets = input_sets(r.B, r.N, r.H, r.P, gen, l2, max_sets=8)
        o = (torch.empty(r.B, r.N, r.H, 512, dtype=torch.bfloat16, device="cuda"),
             torch.empty(r.B, r.N, r.H, dtype=torch.float32, device="cuda"))
        refs = references(tree, pl, *sets[0])
        us = {}
        for plan in (old, new, old, new):
            us.setdefault(plan, []).append(_checked_us(plan, (r.B, r.N, r.H, r.P), tree, pl, sets, o, refs))
        row = dict(B=r.B, N=r.N, H=r.H, P=r.P, old_splits=old[0], new_splits=new[0], old_head=old[1],
                   new_head=new[1], old_tail_splits=old[2], new_tail_splits=new[2],
                   old_us=min(us[old]), new_us=min(us[new]))
        row["new_over_old"] = row["new_us"] / row["old_us"]
        rt = r.B * -(-(r.N * r.H) // _FUSED_BM)   # the model's row tiles: 64 rows (launch_tiles)
        row["model_new_over_old"] = launch_tiles(rt, r.P + r.N, sms, *new) / launch_tiles(rt, r.P + r.N, sms, *old)
        row["min_gain"] = attention._TAIL_MIN_GAIN
        row["costs"] = ",".join(f"{getattr(attention, n):g}" for n in
                                ("_BLOCK_TILES", "_PARTIAL_TILES", "_COMBINE_TILES", "_COMBINE_GROWTH"))
        rows.append(row)
        if w is None:
            w = csv.DictWriter(f, fieldnames=list(row))
            w.writeheader()
        w.writerow(row)  # row by row: a run cut short keeps what it measured
        f.flush()
        print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
        sets.clear()
        torch.cuda.empty_cache()
    f.close()
    ratio = pd.Series([r["new_over_old"] for r in rows])
    print(f"{len(rows)} shapes: new / old min {ratio.min():.3f} median {ratio.median():.3f} max {ratio.max():.3f}; "
          f"slower at {(ratio > 1.01).sum()}, faster at {(ratio < 0.99).sum()}")


if __name__ == "__main__":
    if not 3 <= len(sys.argv) <= 6:
        sys.exit('usage: splits_ab.py GRID_FOLDER OUT.csv ["B,N,H,P;..." [MIN_GAIN [COSTS]]]')
    main(*sys.argv[1:])
