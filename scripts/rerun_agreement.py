"""Rerun agreement of two runs of one sweep: every point present in both, and the share of the
timed points over 50 us whose times agree within 5%, by timing class (device-timed: graph
replay; host-dispatched: eager launches, host paths and an engine step's host phase, whose
times follow the host CPU's speed), by kernel and timing mode, with the median ratio of each
group (a whole group off by the same factor is the machine, not the points' noise), the points that disagree most, and each
run's rows faster than their roof (fraction above 1.05).

Usage: python scripts/rerun_agreement.py parameterized_runs/<run-a> parameterized_runs/<run-b>
"""
from __future__ import annotations

import sys

import pandas as pd

from kdtree.bench.compare import _REP, _keys, _numbered, compare_table
from kdtree.bench.sweep import combine_results

FLOOR_US, WITHIN, WORST, ROOF_TOL = 50.0, 0.05, 15, 1.05


def agreement(run_a: str, run_b: str) -> str:
    """The agreement table of two run folders, as markdown."""
    a, b = combine_results(run_a), combine_results(run_b)
    t = compare_table(a, b)
    t = t[t["metric"] == "median_us"]
    only = t.attrs.get("only", {})
    big = t[(t["a"] >= FLOOR_US) | (t["b"] >= FLOOR_US)].copy()
    big["mode"] = big["mode"].fillna("-") if "mode" in big else "-"
    big["agree"] = (big["ratio"] - 1).abs() <= WITHIN
    lines = [f"{run_b} against {run_a}: {len(t)} timed points in both; only in {run_a}: "
             f"{only.get('a', 0)}, only in {run_b}: {only.get('b', 0)}.",
             f"Points over {FLOOR_US:g} us within {WITHIN:.0%}: {int(big['agree'].sum())} of {len(big)} "
             f"({big['agree'].mean():.1%}).", ""]
    host = big["mode"].isin(["eager", "host"])
    if "phase" in big:   # an engine step's host phase: the time to issue it, whatever the mode
        host |= big["phase"].eq("host")
    for name, g in (("device-timed (graph replay)", big[~host]), ("host-dispatched (eager, host)", big[host])):
        if len(g):
            lines.append(f"- {name}: {int(g['agree'].sum())} of {len(g)} within {WITHIN:.0%} ({g['agree'].mean():.1%})")
    lines += _floor_normalised(a, b)
    for run, df in ((run_a, a), (run_b, b)):
        fast = df[pd.to_numeric(df.get("fraction"), errors="coerce") > ROOF_TOL] if "fraction" in df else df.iloc[:0]
        lines.append(f"- {run}: {len(fast)} rows faster than their roof (fraction above {ROOF_TOL})"
                     + ("" if fast.empty else ": " + ", ".join(f"{k} {m} x{n}" for (k, m), n in
                                                               fast.groupby(["kernel", "mode"]).size().items())))
    lines += ["", "| kernel | mode | points over 50 us | within 5% | share | median ratio | p10-p90 ratio |",
              "|---|---|---|---|---|---|---|"]
    big["kernel"] = big["kernel"].fillna("-")
    for (kernel, mode), g in big.groupby(["kernel", "mode"]):
        lines.append(f"| {kernel} | {mode} | {len(g)} | {int(g['agree'].sum())} | {g['agree'].mean():.1%} | "
                     f"{g['ratio'].median():.3f} | {g['ratio'].quantile(0.1):.2f}-{g['ratio'].quantile(0.9):.2f} |")
    worst = big.assign(off=(big["ratio"] - 1).abs()).sort_values("off", ascending=False).head(WORST)
    keys = [c for c in ("table", "kernel", "variant", "phase", "component", "batch", "budget", "q_len", "prefix",
                        "heads", "mode", "l2") if c in worst and worst[c].notna().any()]
    lines += ["", f"The {len(worst)} points that disagree most:", "",
              "| " + " | ".join(keys) + " | a (us) | b (us) | b / a |", "|" + "---|" * (len(keys) + 3)]
    for _, r in worst.iterrows():
        cells = ["" if pd.isna(r[k]) else str(r[k]) for k in keys]
        lines.append("| " + " | ".join(cells) + f" | {r['a']:.4g} | {r['b']:.4g} | {r['ratio']:.3f} |")
    return "\n".join(lines)


def _floor_normalised(a: pd.DataFrame, b: pd.DataFrame) -> list[str]:
    """Eager points against the host floor timed beside them (``floor_us``): how far the host's
    own speed explains their disagreement (the floors of the same call path moved with it)."""
    if "floor_us" not in a or "floor_us" not in b:
        return []
    keys = [*_keys(a, b), "notebook"]    # joined as compare_table joins a run's points

    def eager(t: pd.DataFrame) -> pd.DataFrame:
        t = _numbered(t[(t["mode"] == "eager") & t["floor_us"].notna()], keys)
        return t[[*keys, _REP, "median_us", "floor_us"]]

    m = eager(a).merge(eager(b), on=[*keys, _REP], suffixes=("_a", "_b"))
    m = m[(m["median_us_a"] >= FLOOR_US) | (m["median_us_b"] >= FLOOR_US)]
    if m.empty:
        return []
    raw = m["median_us_b"] / m["median_us_a"]
    floor = m["floor_us_b"] / m["floor_us_a"]
    norm = raw / floor
    share = lambda r: f"{((r - 1).abs() <= WITHIN).mean():.1%}"  # noqa: E731
    return [f"- eager points with a host floor timed beside them ({len(m)}): {share(raw)} within {WITHIN:.0%} "
            f"as timed, {share(norm)} as time over their own floor; the floors themselves moved "
            f"{floor.quantile(0.1):.2f}-{floor.quantile(0.9):.2f}x (p10-p90) between the runs"]


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(agreement(sys.argv[1], sys.argv[2]))
