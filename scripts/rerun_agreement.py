"""Rerun agreement of two runs of one sweep: every point present in both, and the share of the
timed points over 50 us whose times agree within 5%, by kernel and timing mode.

Usage: python scripts/rerun_agreement.py parameterized_runs/<run-a> parameterized_runs/<run-b>
"""
from __future__ import annotations

import sys

from kdtree.bench.compare import compare_table
from kdtree.bench.sweep import combine_results

FLOOR_US, WITHIN = 50.0, 0.05


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
             f"({big['agree'].mean():.1%}).", "",
             "| kernel | mode | points over 50 us | within 5% | share |", "|---|---|---|---|---|"]
    big["kernel"] = big["kernel"].fillna("-")
    for (kernel, mode), g in big.groupby(["kernel", "mode"]):
        lines.append(f"| {kernel} | {mode} | {len(g)} | {int(g['agree'].sum())} | {g['agree'].mean():.1%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(agreement(sys.argv[1], sys.argv[2]))
