"""Two runs side by side: which points got faster or slower, beyond the noise between runs.

Rows are joined on the declared key columns (:data:`KEYS`: the point's parameters, the kernel,
variant, timing mode, L2 state and, where recorded, the launch plan) and the notebook that
measured them, and every declared metric (:data:`METRICS`) present in both runs is compared,
one row per point and metric. A configuration measured twice in one run (the centre of two
one-axis sweeps) is matched in point order, so two runs of the same sweep compare every point.
Rows computed from other rows of their run (:func:`derived`: the step model's predictions, an
eager step that is the sum of its phases, a difference of two phases) are not measurements and
are left out, counted; their inputs are compared.

The noise model. A change is flagged only when all three hold:

1. the ratio b/a lies outside the union of both runs' p20-p80 spreads, each relative to its
   median (the noise within a run);
2. the change is at least :data:`MIN_CHANGE` (5%) and, for times, :data:`MIN_US` (3 us);
3. the change is beyond :data:`Z` robust standard deviations of the run-to-run scatter seen in
   this comparison: sigma = 1.4826 x the median absolute deviation of the log ratios of the
   compared points of the row's family (its notebook, kernel or table, and timing mode) where
   the family has :data:`MIN_POINTS` points or more. Most points of two runs do not change, so
   their scatter is the noise between the runs; the band is centred on no change, so a shift
   of every point still shows. A smaller family takes the scatter of the noisiest family of
   the same metric and timing mode that shows one (a family too small to show its own noise
   is assumed no quieter than its noisiest peer); with none, the row has no noise estimate and
   is not flagged (``n/a``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from kdtree.bench.display import eng, fmt

# What names a point: the sweep parameters, what ran, how it was timed, and the launch plan.
KEYS = ("kernel", "variant", "path", "stage", "table", "decode", "accuracy", "phase", "component", "routing", "zipf_a",
        "model", "preset", "layers", "gpus", "budget", "q_len", "prefix", "batch", "heads", "depth", "topk", "tokens",
        "nodes", "layout", "impl", "splits", "mode", "l2")
# metric -> (label, unit, higher is better, spread columns or None). Times are in us.
# (The speedup over greedy decoding is a ratio of two compared throughputs: not a metric here.)
METRICS = {
    "median_us": ("time", "us", False, ("p20_us", "p80_us")),
    "tokens_per_s": ("tokens/s", "", True, None),
    "tau": ("acceptance length", "", True, None),
}
# Rows computed from other rows of their run, by column and value: what they are.
DERIVED = {("table", "speedup"): "the step model's prediction from the measured components",
           ("phase", "verify.rest"): "verify less verify.attention",
           ("phase", "step"): "the sum of the phases (eager and host timing; a replayed step graph is timed)"}
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


def derived(t: pd.DataFrame) -> pd.Series:
    """True for the rows of ``t`` computed from other rows of their run (:data:`DERIVED`), not timed."""
    out = pd.Series(False, index=t.index)
    for col, value in DERIVED:
        if col in t.columns:
            hit = t[col] == value
            if value == "step" and "mode" in t.columns:
                hit &= t["mode"] != "graph"
            out |= hit.fillna(False).astype(bool)
    return out


def _family(m: pd.DataFrame) -> pd.Series:
    """The noise family of each joined row: its notebook, its kernel (or, for rows without one,
    its table) and its timing mode."""
    what = pd.Series("", index=m.index)
    for col in ("table", "kernel"):
        if col in m.columns:
            what = m[col].astype(object).where(m[col].notna(), what)
    return _text(m, "notebook") + "/" + what.astype(str) + "/" + _text(m, "mode")


def _text(m: pd.DataFrame, col: str) -> pd.Series:
    """Column ``col`` of ``m`` as text ("" where missing or absent)."""
    return m[col].astype(object).fillna("").astype(str) if col in m.columns else pd.Series("", index=m.index)


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
    not positive or the row has no noise estimate), the spreads ``a_p20`` ... ``b_p80`` where
    the metric has them, the noise band ``band_lo`` / ``band_hi`` the ratio was held against
    and the ``sigma`` behind it. Sorted flagged first, largest change first. ``attrs["sigma"]``
    holds the between-run sigma per metric and family (of the families that show one),
    ``attrs["only_a"]`` /
    ``attrs["only_b"]`` the rows without a partner, ``attrs["derived"]`` the rows of both runs
    left out as :func:`derived`.

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
    join = [*keys, *(["notebook"] if "notebook" in a.columns and "notebook" in b.columns else [])]
    da, db = derived(a), derived(b)
    n_derived = int(da.sum() + db.sum())
    a, b = a[~da], b[~db]
    parts, sigma, only = [], {}, {"a": 0, "b": 0}
    for metric in metrics:
        _, unit, higher, spread = METRICS[metric]
        cols = [metric, *(spread or ())]
        sa, sb = (_numbered(t[t[metric].notna()], join)[[*join, _REP, *cols]] for t in (a, b))
        m = sa.merge(sb, on=[*join, _REP], how="outer", suffixes=("_a", "_b"), indicator=True)
        only["a"] += int((m["_merge"] == "left_only").sum())
        only["b"] += int((m["_merge"] == "right_only").sum())
        m = m[m["_merge"] == "both"].drop(columns=["_merge", _REP])
        if m.empty:
            continue
        va, vb = m[f"{metric}_a"].astype(float), m[f"{metric}_b"].astype(float)
        ok = (va > 0) & (vb > 0)
        ratio = (vb / va).where(ok)
        log_r = np.log(ratio)
        # Noise differs by family (a graph-replayed kernel against a host-timed engine phase):
        # each family that shows its scatter is held against it; a smaller one against the
        # noisiest of its timing mode; without either, no estimate.
        fam, mode = _family(m), _text(m, "mode")
        own = {f: between_run_sigma(log_r[idx]) for f, idx in log_r.groupby(fam).groups.items()
               if np.isfinite(log_r[idx]).sum() >= MIN_POINTS}
        peer = {}
        for f, s in own.items():
            md = mode[fam == f].iat[0]
            peer[md] = max(peer.get(md, 0.0), s)
        s_row = pd.Series([own.get(f, peer.get(md, np.nan)) for f, md in zip(fam, mode)], index=m.index)
        if own:
            sigma[metric] = own
        lo = pd.Series(1.0, index=m.index)
        hi = pd.Series(1.0, index=m.index)
        if spread:
            p20, p80 = spread
            lo = np.minimum(m[f"{p20}_a"] / va, m[f"{p20}_b"] / vb)
            hi = np.maximum(m[f"{p80}_a"] / va, m[f"{p80}_b"] / vb)
        step = np.maximum(MIN_CHANGE, np.expm1(Z * s_row.fillna(0.0)))
        lo, hi = np.minimum(lo, 1 / (1 + step)), np.maximum(hi, 1 + step)
        big = (ratio < lo) | (ratio > hi)
        if unit == "us":
            big &= (vb - va).abs() >= MIN_US
        up = ratio > 1
        worse = up if not higher else ~up
        known = ok & s_row.notna()
        flag = np.where(~known, "n/a", np.where(big & worse, "slower", np.where(big, "faster", "")))
        out = m[keys].assign(metric=metric, a=va, b=vb, ratio=ratio, flag=flag)
        if spread:
            out = out.assign(a_p20=m[f"{spread[0]}_a"], a_p80=m[f"{spread[1]}_a"],
                             b_p20=m[f"{spread[0]}_b"], b_p80=m[f"{spread[1]}_b"])
        parts.append(out.assign(band_lo=lo.where(s_row.notna()), band_hi=hi.where(s_row.notna()), sigma=s_row))
    if not parts:
        raise ValueError(f"compare: the runs have no point in common (joined on {join}; "
                         f"{len(a)} and {len(b)} rows)")
    t = pd.concat(parts, ignore_index=True)
    rank = t["flag"].map({"slower": 0, "faster": 1}).fillna(2)
    t = (t.assign(_rank=rank, _size=-np.abs(np.log(t["ratio"])).fillna(0))
         .sort_values(["_rank", "_size"], kind="stable").drop(columns=["_rank", "_size"]).reset_index(drop=True))
    t.attrs.update(sigma=sigma, only_a=only["a"], only_b=only["b"], keys=keys, derived=n_derived)
    return t


def point_label(t: pd.DataFrame) -> pd.Series:
    """A short name per row: kernel, variant, the parameters as ``name=value``, mode, L2 state,
    and the metric where it is not the time."""
    bare = {"kernel", "variant", "path", "stage", "table", "decode", "phase", "component", "mode", "l2"}
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
    verdict = {"": "within noise", "n/a": "not comparable"}
    lines = [f"{r['ratio']:.3g}x {verdict.get(r['flag'], r['flag'])}: {label} "
             f"({value_text(r['metric'], r['a'])} -> {value_text(r['metric'], r['b'])})"
             for (_, r), label in zip(big.iterrows(), point_label(big))]
    return {"compared": len(t), "slower": int(counts.get("slower", 0)), "faster": int(counts.get("faster", 0)),
            "unchanged": int(counts.get("", 0)), "not comparable": int(counts.get("n/a", 0)),
            "only in a": t.attrs.get("only_a", 0), "only in b": t.attrs.get("only_b", 0),
            "derived": t.attrs.get("derived", 0), "sigma": t.attrs.get("sigma", {}), "largest": lines}


def sigma_text(sigma: dict, metric: str | None = None) -> str:
    """The between-run sigma of ``attrs["sigma"]`` in words, per metric (or of ``metric``):
    ``time 1.2% to 9.8% (7 families)``."""
    parts = []
    for m, fams in sigma.items():
        if metric in (None, m) and fams:
            lo, hi = min(fams.values()), max(fams.values())
            span = f"{100 * lo:.2g}%" + (f" to {100 * hi:.2g}%" if hi > lo else "")
            parts.append(f"{METRICS[m][0]} {span} ({len(fams)} famil{'ies' if len(fams) > 1 else 'y'})")
    return ", ".join(parts) or "n/a"


def rule_text(sigma: dict) -> str:
    """The flag rule in words, with this comparison's between-run sigma."""
    return (f"flagged where the ratio is outside both runs' p20-p80 spreads, at least {MIN_CHANGE:.0%} "
            f"(and {MIN_US:g} us for times) and beyond {Z:g} sigma of the scatter between the runs; sigma "
            f"per family (notebook, kernel or table, timing mode) where {MIN_POINTS} points or more show it, "
            f"else the noisiest family of that timing mode, else no estimate (not comparable): "
            f"{sigma_text(sigma)}. Rows computed from other rows (the step model's predictions, an eager "
            f"step's sum, verify.rest) are not compared")


def summary_text(t: pd.DataFrame, name_a: str, name_b: str, warnings: list[str] = ()) -> str:
    """The terminal summary: warnings, counts, the rule, the largest changes."""
    s = summary(t)
    lines = [f"WARNING: {w}" for w in warnings]
    lines.append(f"{name_b} against {name_a}: {s['compared']} points compared: {s['faster']} faster, "
                 f"{s['slower']} slower, {s['unchanged']} unchanged"
                 + (f", {s['not comparable']} not comparable" if s["not comparable"] else "")
                 + (f"; {s['derived']} derived rows left out" if s["derived"] else "")
                 + (f"; only in {name_a}: {s['only in a']}" if s["only in a"] else "")
                 + (f"; only in {name_b}: {s['only in b']}" if s["only in b"] else ""))
    lines.append(rule_text(s["sigma"]))
    lines.append("largest changes:")
    lines += [f"  {x}" for x in s["largest"]]
    return "\n".join(lines)
