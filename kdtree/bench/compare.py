"""Two runs side by side: which points got faster or slower, beyond the noise between runs.

Rows are joined on the declared key columns (:data:`KEYS`: the point's parameters, the kernel,
variant, timing mode, L2 state and, where recorded, the launch plan) and every declared metric
(:data:`METRICS`) present in both runs is compared, one row per point and metric. A
configuration measured twice in one run (the centre of two one-axis sweeps) is matched in
point order, so two runs of the same sweep compare every point.

The noise model. A change is flagged only when all three hold:

1. the ratio b/a lies outside the union of both runs' p20-p80 spreads, each relative to its
   median (the noise within a run);
2. the change is at least :data:`MIN_CHANGE` (5%) and, for times, :data:`MIN_US` (3 us);
3. the change is beyond :data:`Z` robust standard deviations of the run-to-run scatter seen in
   this comparison: sigma = 1.4826 x the median absolute deviation of the log ratios of every
   compared point of that metric (of the times, for a metric with fewer than
   :data:`MIN_POINTS` points). Most points of two runs do not change, so their scatter is
   the noise between the runs (a loaded CPU host scatters by tens of percent, an idle GPU by
   about one); the band is centred on no change, so a shift of every point still shows.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from kdtree.bench.display import eng, fmt

# What names a point: the sweep parameters, what ran, how it was timed, and the launch plan.
KEYS = ("kernel", "variant", "path", "table", "decode", "accuracy", "phase", "component", "routing", "zipf_a",
        "model", "preset", "layers", "gpus", "budget", "q_len", "prefix", "batch", "heads", "depth", "topk", "tokens",
        "nodes", "layout", "impl", "splits", "mode", "l2")
# metric -> (label, unit, higher is better, spread columns or None). Times are in us.
METRICS = {
    "median_us": ("time", "us", False, ("p20_us", "p80_us")),
    "tokens_per_s": ("tokens/s", "", True, None),
    "speedup": ("speedup over greedy", "x", True, None),
    "tau": ("acceptance length", "", True, None),
}
MIN_CHANGE = 0.05     # relative
MIN_US = 3.0          # absolute, for times
Z = 3.0               # robust standard deviations of the between-run scatter
MIN_POINTS = 8        # fewer compared points of a metric: use the times' scatter
_REP = "_rep"


def _keys(a: pd.DataFrame, b: pd.DataFrame) -> list[str]:
    """Declared keys that either table fills (a key only one run has cannot match)."""
    return [k for k in KEYS if k in a.columns and k in b.columns and (a[k].notna().any() or b[k].notna().any())]


def _numbered(t: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``t`` with a ``_rep`` column numbering rows of equal keys in point order."""
    order = t.sort_values("point", kind="stable") if "point" in t.columns else t
    return order.assign(**{_REP: order.groupby(keys, dropna=False, sort=False).cumcount()})


def _family(m: pd.DataFrame) -> pd.Series:
    """The noise family of each joined row: its kernel (or, for rows without one, its table)
    and its timing mode."""
    what = pd.Series("", index=m.index)
    for col in ("table", "kernel"):
        if col in m.columns:
            what = m[col].astype(object).where(m[col].notna(), what)
    mode = m["mode"].astype(object).fillna("") if "mode" in m.columns else ""
    return what.astype(str) + "/" + mode.astype(str) if "mode" in m.columns else what.astype(str)


def between_run_sigma(log_ratio: pd.Series) -> float:
    """Robust standard deviation of the log ratios (1.4826 x MAD about their median); 0 with
    no finite value."""
    v = log_ratio[np.isfinite(log_ratio)]
    if len(v) == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(v - np.median(v))))


def compare_table(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Join two runs' results on :data:`KEYS`; one row per common point and metric.

    Returns the key columns, then ``metric``, ``a``, ``b``, ``ratio`` (b / a), ``flag``
    (``slower``, ``faster``, ``""`` for no change beyond the noise, ``n/a`` where a value is
    not positive), the spreads ``a_p20`` ... ``b_p80`` where the metric has them, and the
    noise band ``band_lo`` / ``band_hi`` the ratio was held against. Sorted flagged first,
    largest change first. ``attrs["sigma"]`` holds the between-run sigma per metric,
    ``attrs["only_a"]`` / ``attrs["only_b"]`` the rows without a partner.

    Raises
    ------
    ValueError
        When the tables share no key column, no metric, or no point.
    """
    keys = _keys(a, b)
    if not keys:
        raise ValueError(f"compare: the runs share none of the key columns {list(KEYS)}")
    metrics = [m for m in METRICS if m in a.columns and m in b.columns]
    if not metrics:
        raise ValueError(f"compare: the runs share none of the metrics {list(METRICS)}")
    parts, sigma, only = [], {}, {"a": 0, "b": 0}
    for metric in metrics:
        _, unit, higher, spread = METRICS[metric]
        cols = [metric, *(spread or ())]
        sa, sb = (_numbered(t[t[metric].notna()], keys)[[*keys, _REP, *cols]] for t in (a, b))
        m = sa.merge(sb, on=[*keys, _REP], how="outer", suffixes=("_a", "_b"), indicator=True)
        only["a"] += int((m["_merge"] == "left_only").sum())
        only["b"] += int((m["_merge"] == "right_only").sum())
        m = m[m["_merge"] == "both"].drop(columns=["_merge", _REP])
        if m.empty:
            continue
        va, vb = m[f"{metric}_a"].astype(float), m[f"{metric}_b"].astype(float)
        ok = (va > 0) & (vb > 0)
        ratio = (vb / va).where(ok)
        log_r = np.log(ratio)
        # Too few points to see the scatter (the engine's throughput rows): the times' sigma.
        s = sigma[metric] = (between_run_sigma(log_r) if np.isfinite(log_r).sum() >= MIN_POINTS
                             else sigma.get("median_us", 0.0))
        # Noise differs by family (a graph-replayed kernel against a host-timed engine phase):
        # a family with enough points is held against its own scatter, the rest against the
        # metric's.
        fam = _family(m)
        s_row = pd.Series(s, index=m.index)
        for _, idx in log_r.groupby(fam, dropna=False).groups.items():
            if np.isfinite(log_r[idx]).sum() >= MIN_POINTS:
                s_row[idx] = between_run_sigma(log_r[idx])
        lo = pd.Series(1.0, index=m.index)
        hi = pd.Series(1.0, index=m.index)
        if spread:
            p20, p80 = spread
            lo = np.minimum(m[f"{p20}_a"] / va, m[f"{p20}_b"] / vb)
            hi = np.maximum(m[f"{p80}_a"] / va, m[f"{p80}_b"] / vb)
        step = np.maximum(MIN_CHANGE, np.expm1(Z * s_row))
        lo, hi = np.minimum(lo, 1 / (1 + step)), np.maximum(hi, 1 + step)
        big = (ratio < lo) | (ratio > hi)
        if unit == "us":
            big &= (vb - va).abs() >= MIN_US
        up = ratio > 1
        worse = up if not higher else ~up
        flag = np.where(~ok, "n/a", np.where(big & worse, "slower", np.where(big, "faster", "")))
        out = m[keys].assign(metric=metric, a=va, b=vb, ratio=ratio, flag=flag)
        if spread:
            out = out.assign(a_p20=m[f"{spread[0]}_a"], a_p80=m[f"{spread[1]}_a"],
                             b_p20=m[f"{spread[0]}_b"], b_p80=m[f"{spread[1]}_b"])
        parts.append(out.assign(band_lo=lo, band_hi=hi))
    if not parts:
        raise ValueError(f"compare: the runs have no point in common (joined on {keys}; "
                         f"{len(a)} and {len(b)} rows)")
    t = pd.concat(parts, ignore_index=True)
    rank = t["flag"].map({"slower": 0, "faster": 1}).fillna(2)
    t = (t.assign(_rank=rank, _size=-np.abs(np.log(t["ratio"])).fillna(0))
         .sort_values(["_rank", "_size"], kind="stable").drop(columns=["_rank", "_size"]).reset_index(drop=True))
    t.attrs.update(sigma=sigma, only_a=only["a"], only_b=only["b"], keys=keys)
    return t


def point_label(t: pd.DataFrame) -> pd.Series:
    """A short name per row: kernel, variant, the parameters as ``name=value``, mode, L2 state,
    and the metric where it is not the time."""
    bare = {"kernel", "variant", "path", "table", "decode", "phase", "component", "mode", "l2"}
    keys = [k for k in t.attrs.get("keys", KEYS) if k in t.columns]

    def one(r):
        parts = [(str(r[k]) if k in bare else f"{k}={fmt(r[k])}") for k in keys
                 if not pd.isna(r[k]) and str(r[k]) not in ("", "n/a")]
        return " ".join(parts + ([METRICS[r["metric"]][0]] if r["metric"] != "median_us" else []))
    return t.apply(one, axis=1)


def value_text(metric: str, v) -> str:
    """A metric's value formatted with its unit (``87.8 us``, ``10.4 ms``; ``3,719`` tokens/s)."""
    unit = METRICS[metric][1]
    return eng(v * 1e-6, "s") if unit == "us" else fmt(v, unit)


def summary(t: pd.DataFrame, top: int = 5) -> dict:
    """Counts (compared, slower, faster, unchanged, not comparable, only in a / b), the between-run
    sigma per metric, and the ``top`` largest changes as text lines."""
    counts = t["flag"].value_counts()
    big = t[np.isfinite(t["ratio"])].assign(_s=lambda d: np.abs(np.log(d["ratio"]))).nlargest(top, "_s")
    lines = [f"{r['ratio']:.3g}x {r['flag'] or 'within noise'}: {label} "
             f"({value_text(r['metric'], r['a'])} -> {value_text(r['metric'], r['b'])})"
             for (_, r), label in zip(big.iterrows(), point_label(big))]
    return {"compared": len(t), "slower": int(counts.get("slower", 0)), "faster": int(counts.get("faster", 0)),
            "unchanged": int(counts.get("", 0)), "not comparable": int(counts.get("n/a", 0)),
            "only in a": t.attrs.get("only_a", 0), "only in b": t.attrs.get("only_b", 0),
            "sigma": t.attrs.get("sigma", {}), "largest": lines}


def rule_text(sigma: dict) -> str:
    """The flag rule in words, with this comparison's between-run sigma."""
    s = ", ".join(f"{METRICS[m][0]} {100 * v:.3g}%" for m, v in sigma.items())
    return (f"flagged where the ratio is outside both runs' p20-p80 spreads, at least {MIN_CHANGE:.0%} "
            f"(and {MIN_US:g} us for times) and beyond {Z:g} sigma of the scatter between the runs "
            f"(sigma per kernel and timing mode where {MIN_POINTS} points or more show it, else per "
            f"metric: {s or 'n/a'})")


def summary_text(t: pd.DataFrame, name_a: str, name_b: str, warnings: list[str] = ()) -> str:
    """The terminal summary: warnings, counts, the rule, the largest changes."""
    s = summary(t)
    lines = [f"WARNING: {w}" for w in warnings]
    lines.append(f"{name_b} against {name_a}: {s['compared']} points compared: {s['faster']} faster, "
                 f"{s['slower']} slower, {s['unchanged']} unchanged"
                 + (f", {s['not comparable']} not comparable" if s["not comparable"] else "")
                 + (f"; only in {name_a}: {s['only in a']}" if s["only in a"] else "")
                 + (f"; only in {name_b}: {s['only in b']}" if s["only in b"] else ""))
    lines.append(rule_text(s["sigma"]))
    lines.append("largest changes:")
    lines += [f"  {x}" for x in s["largest"]]
    return "\n".join(lines)
