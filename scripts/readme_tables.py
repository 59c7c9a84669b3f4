"""Regenerate the README's results tables from ONE committed run, and name the run.

Usage (from the repository root):

    python scripts/readme_tables.py parameterized_runs/<run-id> [--readme README.md] [--check]

Reads the run's combined results, its ceilings and its manifest (``kdtree.bench.report``),
classifies the timed rows on the run's own ceilings (with the run's counter comparison, where
its ``04_counters`` notebook ran), and writes, between the README's ``<!-- results:begin -->``
and ``<!-- results:end -->`` marker lines, a paragraph naming the run (id, git commit, device,
date, ceilings) and two tables: headline timings (CUDA-graph replay, medians) and, when the
run has counters, the cost model against Nsight Compute. Nothing outside the markers changes.
``--check`` exits 1 when the README is not what the run gives (for CI), without writing.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from kdtree.bench.counters import TOLERANCE
from kdtree.bench.report import run_ceilings
from kdtree.bench.roofline import classify
from kdtree.bench.sweep import combine_results, read_manifest

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
VERIFY_HEADLINE = [(1, 33, 64, 4096), (16, 33, 64, 16384)]      # (B, N, H, P), where the run has them


def _us(x: float) -> str:
    if x >= 1e4:
        return f"{x / 1e3:.3g} ms"
    return f"{x:.0f} us" if x >= 100 else f"{x:.3g} us"


def _graph(df: pd.DataFrame, **eq) -> pd.DataFrame:
    d = df[df["mode"] == "graph"]
    for k, v in eq.items():
        d = d[d[k] == v]
    return d


def tree_rows(df: pd.DataFrame) -> list[list[str]]:
    """Tree build at the largest and the smallest (batch, budget) on the GPU, against the CPU
    reference path and the serial heap kernel; accept + compaction at the largest."""
    build = _graph(df, kernel="build", variant="gpu")
    if build.empty:
        return []
    rows = []
    keys = build[["batch", "budget"]].drop_duplicates().astype(int).sort_values(["batch", "budget"])
    for batch, budget in dict.fromkeys([tuple(keys.iloc[-1]), tuple(keys.iloc[0])]):
        b = build[(build.batch == batch) & (build.budget == budget)].iloc[0]
        against = []
        cpu = df[(df.kernel == "build") & (df.variant == "cpu_paper") & (df.batch == batch) & (df.budget == budget)]
        if len(cpu):
            t = cpu["median_us"].iloc[0]
            against.append(f"paper's CPU path {_us(t)} ({t / b.median_us:.0f}x)")
        heap = _graph(df, kernel="build", variant="gpu_heap", batch=batch, budget=budget)
        if len(heap):
            against.append(f"serial heap kernel {_us(heap['median_us'].iloc[0])}")
        share = b.get("parallel")
        path = f" ({share:.0%} of sequences on the parallel path)" if pd.notna(share) else ""
        rows.append([f"tree build, GPU{path}", f"batch {batch}, budget {budget}, L={int(b.depth)}", _us(b.median_us),
                     "; ".join(against)])
    acc = _graph(df, kernel="accept+compact", variant="gpu")
    if len(acc):
        a = acc.sort_values(["batch", "budget"]).iloc[-1]
        rows.append(["accept + compaction", f"batch {int(a.batch)}, budget {int(a.budget)}", _us(a.median_us), ""])
    return rows


def verify_rows(df: pd.DataFrame, ceilings) -> list[list[str]]:
    """``fused`` at the headline shapes the run has (cold L2), against every other variant
    measured at the same point."""
    d = _graph(df, kernel="verify_attention", l2="cold")
    rows = []
    for B, N, H, P in VERIFY_HEADLINE:
        pt = d[(d.batch == B) & (d.q_len == N) & (d.heads == H) & (d.prefix == P)]
        fused = pt[pt.variant == "fused"]
        if fused.empty:
            continue
        f = fused.iloc[0]
        plan = (f" ({f['impl']}, {f['layout']}, {int(f['splits'])} KV split{'s' if f['splits'] > 1 else ''})"
                if pd.notna(f.get("splits")) else "")
        others = [f"`{o.variant}` {_us(o.median_us)} ({o.median_us / f.median_us:.1f}x)"
                  for o in pt[pt.variant != "fused"].sort_values("median_us").itertuples()]
        rows.append([f"verify attention, `fused`{plan}", f"B={B}, N={N}, H={H}, P={P}, cold L2",
                     f"{_us(f.median_us)}, {f.achieved_tflops:.0f} TFLOP/s "
                     f"({f.achieved_tflops * 1e12 / ceilings.tensor_flops:.0%} of measured bf16), {f.bound}-bound",
                     ", ".join(others)])
    return rows


def counter_rows(combined: pd.DataFrame) -> list[list[str]]:
    """The cost model against the counters, per profiled call (DRAM bytes and tensor FLOPs)."""
    if not {"figure", "launch", "call"} <= set(combined.columns):
        return []
    c = combined[combined["figure"].notna() & (combined["launch"].astype(str) == "all")]
    rows = []
    for _, g in c.groupby("call", sort=True):
        first = g.iloc[0]
        shape = (f"B={int(first.batch)}, N={int(first.q_len)}, H={int(first.heads)}, P={int(first.prefix)}"
                 if first.kernel == "verify_attention" else f"batch {int(first.batch)}, budget {int(first.budget)}")
        cells = []
        for fig in ("dram_bytes", "tensor_flops", "l2_read"):
            r = g[g["figure"] == fig]
            if r.empty:
                cells.append("")
                continue
            r = r.iloc[0]
            unit, scale = ("GFLOP", 1e9) if fig == "tensor_flops" else ("MB", 1e6)
            cells.append(f"{r.counter / scale:.3g} / {r.model / scale:.3g} {unit} = {r.ratio:.2f}"
                         + (f" **{r.flag}**" if r.flag and r.target else ""))
        rows.append([f"{first.kernel} `{first.variant}`", shape, *cells])
    return rows


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def block(run_dir: str | Path) -> str:
    """The markdown between the markers, from the run in ``run_dir``."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    ceilings = run_ceilings(run_dir)
    combined = combine_results(run_dir)
    if combined.empty or "median_us" not in combined.columns:
        raise ValueError(f"run_dir: {run_dir} has no timed results")
    timed = combined[combined["median_us"].notna()].reset_index(drop=True)
    df = classify(timed, ceilings, counters=combined)
    meta = manifest.get("metadata", {})
    sha = str(meta.get("git_sha", "unknown"))[:12] + (" (dirty tree)" if meta.get("git_dirty") else "")
    clocks = f", SM clock {meta['sm_clock_mhz']:.0f} MHz during timing" if meta.get("sm_clock_mhz") else ""
    out = [f"Generated by `scripts/readme_tables.py` from the committed run `{manifest['run_id']}` "
           f"(`{run_dir.as_posix()}`; git {sha}; {meta.get('device', ceilings.device)}{clocks}; "
           f"{meta.get('date', '')}). Every figure below comes from that run. Ceilings measured in it: "
           f"{ceilings.caption()}.", "",
           "Headline numbers (CUDA-graph replay, medians):", "",
           _table(["what", "shape", "time", "against (same run)"], tree_rows(df) + verify_rows(df, ceilings))]
    cr = counter_rows(combined)
    if cr:
        out += ["", f"The cost model against Nsight Compute (counter / model = ratio; L2 flushed before each "
                    f"kernel; targets: DRAM bytes within {TOLERANCE['dram_bytes']:.0%}, tensor FLOPs as executed "
                    f"within {TOLERANCE['tensor_flops']:.0%}; L2 -> SM reads shown for the picture):", "",
                _table(["kernel", "shape", "DRAM bytes", "tensor FLOPs", "L2 -> SM reads"], cr)]
    return "\n".join(out)


def replace_block(text: str, new: str) -> str:
    """``text`` with the lines between the marker lines replaced by ``new``."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"readme: needs exactly one {BEGIN} line followed by one {END} line")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{new}\n{END}{tail}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", help="the committed run, e.g. parameterized_runs/<run-id>")
    ap.add_argument("--readme", default="README.md")
    ap.add_argument("--check", action="store_true", help="exit 1 if the README differs; write nothing")
    a = ap.parse_args(argv)
    readme = Path(a.readme)
    text = readme.read_text()
    new = replace_block(text, block(a.run_dir))
    if a.check:
        print("README tables are current" if new == text else f"README tables differ from {a.run_dir}")
        return 0 if new == text else 1
    readme.write_text(new)
    print(f"{readme}: tables from {a.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
