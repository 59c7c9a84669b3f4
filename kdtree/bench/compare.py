"""Two runs side by side: which points got faster or slower, beyond the noise between runs.

Rows are joined on the declared key columns (:data:`KEYS`: the point's parameters, the kernel,
variant, timing mode, L2 state and, where recorded, the launch plan) and the notebook that
measured them, and every declared metric (:data:`METRICS`) present in both runs is compared,
one row per point and metric. A configuration measured twice in one run (the centre of two
one-axis sweeps) is matched in point order, so two runs of the same sweep compare every point.
Rows computed from other rows of their run (:func:`derived`: the step model's predictions, an
eager step that is the sum of its phases, a difference of two phases) are not measurements and
are left out, counted; their inputs are compared.

The noise model. Two runs of the same code on the same machine do not agree point by point:
clocks, caches, other processes and, on a shared host, bursts of interference (a neighbour on
the sibling hyperthread makes a host-timed call up to ~1.8x slower for seconds at a time)
move a point's median further than its own p20-p80 spread says. So the flag holds each
point against the scatter *between* the two runs, measured on the comparison's own points,
one family at a time (its notebook, its kernel or table, and its timing mode: a graph-
replayed kernel and a host-timed engine phase have different noise). For the log ratios
e = log(b/a) of a family with :data:`MIN_POINTS` compared points or more:

* the family's shift c is their median. A shift of the whole family (every point moved
  together: the machine drifted, or a change common to every point) is reported once, as
  the family's shift, when it is at least :data:`MIN_CHANGE`, beyond :data:`Z` standard
  errors of the median (1.2533 sigma / sqrt(n)) and, for times, moved at least a fifth of
  the family's points by :data:`MIN_US` or more (a family of small and large times that
  drifts 7% moves its large ones by more than their minimum change while its median point
  moves less; its large points moved with it); its points are then judged against it;
* the family's between-run scatter sigma is the larger of the core scatter (1.4826 x the
  median absolute deviation of e about c) and the tail scatter (the :data:`TAIL_Q` quantile
  of |e - c| over its normal quantile, 1.2816): the scale within which four points in five
  agree. Both equal the standard deviation for Gaussian noise. Where interference moved
  more than a fifth of a family's points (on a shared host it comes in bursts of seconds
  that touch whole stretches of a sweep), the tail scatter lies among the disturbed points
  and the band spans them; the median absolute deviation, blind to whatever touches fewer
  than half of the points, would call each of them a change.

What two runs cannot tell apart is a change to a part of a family from interference on that
part. A change to fewer than a fifth of a family's points is flagged point by point, and so
is interference on fewer than a fifth (it shows as flagged points of a comparison of
identical code); a change to more (a fifth to a half) widens the family's band instead of
being flagged, which the family's noise table shows as a tail scatter well above the core
scatter, and which no flag hides: the band each family was held to is on the page.

A point is flagged slower or faster only when its ratio lies outside all of:

1. the union of both runs' p20-p80 spreads, each relative to its median (the noise within
   a run);
2. the minimum change: :data:`MIN_CHANGE` (5%) and, for times, :data:`MIN_US` (3 us);
3. :data:`Z` (3) sigma of its family's between-run scatter, around no change and around the
   family's shift where one is reported (a point that moved with its family is not flagged
   again; a point that stood still while its family moved is not flagged either);

and, for times, the ratio of the two runs' p20s lies outside the same band on the same side.
Interference from other processes only adds time, so the fastest fifth of a point's
repetitions is what it disturbs least (two CPU runs on a shared VM had medians 1.3-1.6x apart
with p20s within 4%), while a change of the code moves the p20 with the median. A change
that slows only some repetitions of a point and leaves its p20 is therefore not flagged; it
shows as a wider spread.

A family with fewer points takes the scatter of the noisiest family of the same metric and
timing mode (assumed no quieter than its noisiest peer) and no shift; with no such peer the
row has no noise estimate and is not flagged (``n/a``).
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
Z = 3.0               # standard deviations of the between-run scatter
MIN_POINTS = 8        # fewer compared points in a family: its noisiest peer's scatter
TAIL_Q = 0.8          # the tail scatter: the scale within which this share of a family's points agree
_TAIL_NORMAL = 1.2816  # the normal distribution's two-sided TAIL_Q quantile (P(|x| < 1.2816) = 0.8)
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


def family_noise(log_ratio: pd.Series) -> dict:
    """The between-run noise of one family from its log ratios (finite values only).

    Returns ``points``, ``shift`` (their median, c), ``core`` (1.4826 x their median absolute
    deviation about c), ``tail`` (the :data:`TAIL_Q` quantile of their absolute deviation
    from c over 1.2816) and ``sigma`` (the larger of the two); zeros with no finite value.
    """
    v = np.asarray(log_ratio, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return {"points": 0, "shift": 0.0, "core": 0.0, "tail": 0.0, "sigma": 0.0}
    c = float(np.median(v))
    d = np.abs(v - c)
    core, tail = 1.4826 * float(np.median(d)), float(np.quantile(d, TAIL_Q)) / _TAIL_NORMAL
    return {"points": len(v), "shift": c, "core": core, "tail": tail, "sigma": max(core, tail)}


def _shift_reported(n: dict, abs_change: float | None) -> bool:
    """Whether a family's shift is reported: at least :data:`MIN_CHANGE`, beyond :data:`Z`
    standard errors of its median and, for times, ``abs_change`` (the :data:`TAIL_Q` quantile
    of the points' absolute changes: a fifth of them moved this much or more) at least
    :data:`MIN_US`."""
    c = abs(n["shift"])
    return (n["points"] >= MIN_POINTS and np.expm1(c) >= MIN_CHANGE and c > Z * 1.2533 * n["sigma"] / np.sqrt(n["points"])
            and (abs_change is None or abs_change >= MIN_US))


def compare_table(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Join two runs' results on :data:`KEYS`; one row per common point and metric.

    Returns the key columns, then ``metric``, ``family`` (the noise family: notebook/kernel or
    table/timing mode), ``a``, ``b``, ``ratio`` (b / a), ``flag`` (``slower``, ``faster``,
    ``""`` for no change beyond the noise, ``n/a`` where a value is not positive or the row has
    no noise estimate), the spreads ``a_p20`` ... ``b_p80`` where the metric has them, the
    noise band ``band_lo`` / ``band_hi`` the ratio was held against, the ``sigma`` behind it
    and ``family_shift`` (the ratio by which the row's whole family moved, where that shift is
    reported; else NaN). Sorted flagged first, largest change first. ``attrs["sigma"]`` holds
    the between-run sigma per metric and family (of the families that show one),
    ``attrs["noise"]`` their :func:`family_noise` (with ``shifted``: the shift is reported),
    ``attrs["only_a"]`` / ``attrs["only_b"]`` the rows without a partner, ``attrs["derived"]``
    the rows of both runs left out as :func:`derived`.

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
    parts, sigma, noise, only = [], {}, {}, {"a": 0, "b": 0}
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
        fams = {f: family_noise(log_r[idx]) for f, idx in log_r.groupby(fam).groups.items()}
        own = {f: n for f, n in fams.items() if n["points"] >= MIN_POINTS}
        for f, n in own.items():
            sel = (fam == f) & ok
            n["shifted"] = _shift_reported(n, float((vb - va)[sel].abs().quantile(TAIL_Q)) if unit == "us" else None)
        peer = {}
        for f, n in own.items():
            md = mode[fam == f].iat[0]
            peer[md] = max(peer.get(md, 0.0), n["sigma"])
        s_row = pd.Series([own[f]["sigma"] if f in own else peer.get(md, np.nan) for f, md in zip(fam, mode)],
                          index=m.index)
        shift = pd.Series([np.exp(own[f]["shift"]) if f in own and own[f]["shifted"] else np.nan for f in fam],
                          index=m.index)
        if own:
            sigma[metric] = {f: n["sigma"] for f, n in own.items()}
            noise[metric] = own
        lo = pd.Series(1.0, index=m.index)
        hi = pd.Series(1.0, index=m.index)
        if spread:
            p20, p80 = spread
            lo = np.minimum(m[f"{p20}_a"] / va, m[f"{p20}_b"] / vb)
            hi = np.maximum(m[f"{p80}_a"] / va, m[f"{p80}_b"] / vb)
        step = np.maximum(MIN_CHANGE, np.expm1(Z * s_row.fillna(0.0)))
        lo, hi = np.minimum(lo, 1 / (1 + step)), np.maximum(hi, 1 + step)
        # Beyond the band around no change and around the family's reported shift, both.
        lo, hi = lo * np.minimum(1.0, shift.fillna(1.0)), hi * np.maximum(1.0, shift.fillna(1.0))
        big = (ratio < lo) | (ratio > hi)
        if spread:
            # Interference only adds time: the fastest fifth of a point's repetitions (its p20)
            # is the least disturbed, and a change of the code moves it with the median.
            r20 = m[f"{spread[0]}_b"] / m[f"{spread[0]}_a"]
            big &= ((ratio > hi) & (r20 > hi)) | ((ratio < lo) & (r20 < lo)) | r20.isna()
        if unit == "us":
            big &= (vb - va).abs() >= MIN_US
        up = ratio > 1
        worse = up if not higher else ~up
        known = ok & s_row.notna()
        flag = np.where(~known, "n/a", np.where(big & worse, "slower", np.where(big, "faster", "")))
        out = m[keys].assign(metric=metric, family=fam.to_numpy(), a=va, b=vb, ratio=ratio, flag=flag)
        if spread:
            out = out.assign(a_p20=m[f"{spread[0]}_a"], a_p80=m[f"{spread[1]}_a"],
                             b_p20=m[f"{spread[0]}_b"], b_p80=m[f"{spread[1]}_b"])
        parts.append(out.assign(band_lo=lo.where(s_row.notna()), band_hi=hi.where(s_row.notna()), sigma=s_row,
                                family_shift=shift))
    if not parts:
        raise ValueError(f"compare: the runs have no point in common (joined on {join}; "
                         f"{len(a)} and {len(b)} rows)")
    t = pd.concat(parts, ignore_index=True)
    rank = t["flag"].map({"slower": 0, "faster": 1}).fillna(2)
    t = (t.assign(_rank=rank, _size=-np.abs(np.log(t["ratio"])).fillna(0))
         .sort_values(["_rank", "_size"], kind="stable").drop(columns=["_rank", "_size"]).reset_index(drop=True))
    t.attrs.update(sigma=sigma, noise=noise, only_a=only["a"], only_b=only["b"], keys=keys, derived=n_derived)
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


def _direction(metric: str, ratio: float) -> str:
    """``slower`` or ``faster`` for a ratio b/a of ``metric`` (above 1 is slower for times)."""
    return "slower" if (ratio > 1) != METRICS[metric][2] else "faster"


def family_table(t: pd.DataFrame) -> pd.DataFrame:
    """One row per metric and noise family of :func:`compare_table`'s result: points, the
    family's shift (ratio, and whether it is reported), its core and tail scatter and the sigma
    used (as relative changes), the band a point must leave (``1 + max(MIN_CHANGE, e^(Z sigma) - 1)``)
    and the points flagged slower and faster. Families too small to show their scatter are
    not listed."""
    rows = []
    for metric, fams in t.attrs.get("noise", {}).items():
        for fam, n in fams.items():
            g = t[(t["metric"] == metric) & (t["family"] == fam)]
            rows.append({"metric": metric, "family": fam, "points": n["points"], "shift": np.exp(n["shift"]),
                         "shift reported": bool(n.get("shifted")), "core": np.expm1(n["core"]),
                         "tail": np.expm1(n["tail"]), "sigma": np.expm1(n["sigma"]),
                         "band": 1 + max(MIN_CHANGE, float(np.expm1(Z * n["sigma"]))),
                         "slower": int((g["flag"] == "slower").sum()), "faster": int((g["flag"] == "faster").sum())})
    return pd.DataFrame(rows, columns=["metric", "family", "points", "shift", "shift reported", "core", "tail",
                                       "sigma", "band", "slower", "faster"])


def shift_lines(t: pd.DataFrame) -> list[str]:
    """The families whose whole set of points moved together, one line each:
    ``02_verify/verify_attention/graph: 1.2x slower as a whole (time, 40 points)``."""
    f = family_table(t)
    return [f"{r['family']}: {r['shift']:.3g}x {_direction(r['metric'], r['shift'])} as a whole "
            f"({METRICS[r['metric']][0]}, {r['points']} points)" for _, r in f[f["shift reported"]].iterrows()]


def summary(t: pd.DataFrame, top: int = 5) -> dict:
    """Counts (compared, slower, faster, unchanged, not comparable, only in a / b; ``with
    family``: the unchanged rows whose family shifted as a whole), the between-run sigma per
    metric, the families' shifts (:func:`shift_lines`) and the ``top`` largest changes as text
    lines."""
    counts = t["flag"].value_counts()
    big = t[np.isfinite(t["ratio"])].assign(_s=lambda d: np.abs(np.log(d["ratio"]))).nlargest(top, "_s")
    verdict = {"": "within noise", "n/a": "not comparable"}
    lines = [f"{r['ratio']:.3g}x {verdict.get(r['flag'], r['flag'])}: {label} "
             f"({value_text(r['metric'], r['a'])} -> {value_text(r['metric'], r['b'])})"
             for (_, r), label in zip(big.iterrows(), point_label(big))]
    return {"compared": len(t), "slower": int(counts.get("slower", 0)), "faster": int(counts.get("faster", 0)),
            "unchanged": int(counts.get("", 0)), "not comparable": int(counts.get("n/a", 0)),
            "only in a": t.attrs.get("only_a", 0), "only in b": t.attrs.get("only_b", 0),
            "derived": t.attrs.get("derived", 0), "sigma": t.attrs.get("sigma", {}), "largest": lines,
            "with family": int(((t["flag"] == "") & t["family_shift"].notna()).sum()), "shifts": shift_lines(t)}


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
    """The noise model and flag rule in words, with this comparison's between-run sigma."""
    return (f"A point is flagged when its ratio b/a is outside both runs' p20-p80 spreads, at least "
            f"{MIN_CHANGE:.0%} (and {MIN_US:g} us for times) and beyond {Z:g} sigma of the scatter between "
            f"the runs, both around no change and around its family's shift where one is reported, and for "
            f"times the ratio of the p20s is beyond the same band too (interference only adds time: the fastest "
            f"fifth of the repetitions is the least disturbed, and a change of the code moves it). Families: "
            f"notebook, kernel or table, timing mode. Per family with {MIN_POINTS} points or more: the shift is "
            f"the median log ratio, reported when at least {MIN_CHANGE:.0%}, beyond {Z:g} standard errors and, "
            f"for times, when a fifth of the points moved {MIN_US:g} us or more; "
            f"sigma is the larger of 1.4826 x the median absolute deviation and the "
            f"{100 * TAIL_Q:.0f}th percentile of the absolute deviation / {_TAIL_NORMAL} (the scale within "
            f"which {100 * TAIL_Q:.0f}% of its points agree: the standard deviation for Gaussian noise; where "
            f"interference on a shared host moved more than a fifth of the points, it spans them). A smaller "
            f"family takes the noisiest family of its timing mode, else it is not comparable. Sigma here: "
            f"{sigma_text(sigma)}. Rows computed from other rows (the step model's predictions, an eager "
            f"step's sum, verify.rest) are not compared")


def summary_text(t: pd.DataFrame, name_a: str, name_b: str, warnings: list[str] = ()) -> str:
    """The terminal summary: warnings, counts, the rule, the largest changes."""
    s = summary(t)
    lines = [f"WARNING: {w}" for w in warnings]
    lines.append(f"{name_b} against {name_a}: {s['compared']} points compared: {s['faster']} faster, "
                 f"{s['slower']} slower, {s['unchanged']} unchanged"
                 + (f" ({s['with family']} of them in families that moved as a whole)" if s["with family"] else "")
                 + (f", {s['not comparable']} not comparable" if s["not comparable"] else "")
                 + (f"; {s['derived']} derived rows left out" if s["derived"] else "")
                 + (f"; only in {name_a}: {s['only in a']}" if s["only in a"] else "")
                 + (f"; only in {name_b}: {s['only in b']}" if s["only in b"] else ""))
    lines.append(rule_text(s["sigma"]))
    if s["shifts"]:
        lines.append("families that moved as a whole (the machine, or a change common to every point):")
        lines += [f"  {x}" for x in s["shifts"]]
    lines.append("largest changes:")
    lines += [f"  {x}" for x in s["largest"]]
    return "\n".join(lines)
