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
import json
import sys
from pathlib import Path

import pandas as pd

from kdtree.bench.counters import TOLERANCE
from kdtree.bench.display import eng
from kdtree.bench.report import run_ceilings
from kdtree.bench.roofline import classify
from kdtree.bench.sweep import combine_results, read_manifest

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
VERIFY_HEADLINE = [(1, 33, 64, 4096), (16, 33, 64, 16384)]      # (B, N, H, P), where the run has them


def _us(x: float) -> str:
    """A time in microseconds, in the project's engineering notation (``87.8 us``, ``2.82 ms``)."""
    return eng(x * 1e-6, "s")


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
        for fig in ("dram_bytes", "tensor_flops", "l2_read", "l2_served"):
            r = g[g["figure"] == fig]
            if r.empty:
                cells.append("")
                continue
            r = r.iloc[0]
            # ``modelled`` (``model`` in runs made before the rename)
            m = r["modelled"] if "modelled" in r and pd.notna(r["modelled"]) else r["model"]
            unit, scale = ("GFLOP", 1e9) if fig == "tensor_flops" else ("MB", 1e6)
            cells.append(f"{r.counter / scale:.3g} / {m / scale:.3g} {unit} = {r.ratio:.2f}"
                         + (f" **{r.flag}**" if r.flag and r.target else "")
                         + (" (not judged: under the floor)" if str(r.get("note", "")).startswith("not judged") else ""))
        rows.append([f"{first.kernel} `{first.variant}`", shape, *cells])
    return rows


def engine_lines(combined: pd.DataFrame) -> list[str]:
    """The engine notebook's graph-replay throughput and its step breakdown at the largest budget."""
    e = combined[combined.get("notebook", pd.Series(dtype=str)) == "03_ddtree_step"]
    if e.empty or "table" not in e:
        return []
    tp = e[(e["table"] == "throughput") & (e["mode"] == "graph")]
    rows = [[("greedy" if r.decode == "ar" else r.decode) + ("" if r.decode != "ddtree" else f" {int(r.budget)}"),
             f"{r.tau:.2f}", f"{r.tokens_per_s:.0f}", f"{r.speedup:.2f}x" + ("" if r.self_consistent else " (unsettled)")]
            for r in tp.itertuples()]
    out = ["", "The engine (`03_ddtree_step`: `kimi_k2_attn` at 4 layers, random weights, batch 1, "
               "drafter calibrated to the DDTree paper; CUDA-graph replay):", "",
           _table(["decode", "tau", "tokens/s", "speedup over greedy"], rows)]
    bd = e[(e["table"] == "breakdown") & (e["mode"] == "graph") & (e["decode"] == "ddtree")]
    if not bd.empty:
        b = bd[bd["budget"] == bd["budget"].max()].set_index("phase")["median_us"]
        tree_ops = sum(float(b.get(k, 0.0)) for k in ("build", "accept", "compact"))
        out += ["", f"One step at budget {int(bd['budget'].max())} takes {_us(b['step'])}: verify {_us(b['verify'])} "
                    f"(attention {_us(b['verify.attention'])}), draft {_us(b['draft'])}, tree build + accept + "
                    f"compaction {_us(tree_ops)} ({tree_ops / b['step']:.1%}), host {_us(b['host'])} (one graph replay)."]
    return out


def moe_lines(combined: pd.DataFrame) -> list[str]:
    """The MoE notebook: fraction of HBM bandwidth against verify tokens, best budgets, validation."""
    m = combined[combined.get("notebook", pd.Series(dtype=str)) == "05_moe_verify"]
    if m.empty or "table" not in m:
        return []
    out = []
    moe = m[(m["table"] == "moe") & (m["routing"] == "model")]
    if not moe.empty:
        rows = [[r.variant, f"{int(r.tokens)}", f"{int(r.distinct)}", _us(r.median_us), f"{r.hbm_fraction:.0%}",
                 f"{r.gemm_hbm_fraction:.0%}", r.bound] for r in moe.itertuples()]
        out += ["", "One MoE layer of the Kimi K2 EP8 shard (`05_moe_verify`: 48 local of 384 experts, the "
                    "model's router, graph replay; fraction = bytes of the distinct experts touched / time / "
                    "measured HBM bandwidth):", "",
                _table(["experts", "verify tokens T", "distinct experts", "layer time", "fraction of HBM",
                        "grouped GEMMs alone", "bound"], rows)]
    sp = m[(m["table"] == "speedup") & (m.get("best", False) == True)]  # noqa: E712
    if "comm" in sp:
        sp = sp[sp["comm"].isin(["allreduce"]) | sp["comm"].isna()]
    if not sp.empty:
        rows = [[r.model, f"{int(r.gpus)}", f"{int(r.batch)}", f"{int(r.prefix)}", f"{int(r.budget)}",
                 f"{r.tau:.2f}", f"{r.speedup:.2f}x"] for r in sp.sort_values(["model", "batch", "prefix"]).itertuples()]
        out += ["", "The step model's best budget (measured components, modelled links, the paper's tau curve):", "",
                _table(["model", "GPUs", "batch", "prefix", "best budget", "tau", "speedup over greedy"], rows)]
    val = m[m["table"] == "validation"]
    if not val.empty:
        rows = [[f"`{r.preset}`", f"{int(r.batch)}", "greedy" if r.budget == 0 else f"{int(r.budget)}",
                 _us(r.measured_us), _us(r.predicted_us), f"{r.ratio:.2f}"] for r in val.itertuples()]
        layers = ", ".join(str(n) for n in sorted(val["layers"].astype(int).unique()))
        out += ["", f"The step model against the engine's measured step ({layers} engine layers; ratio = "
                    f"predicted / measured, from {val['ratio'].min():.2f} to {val['ratio'].max():.2f}):", "",
                _table(["preset", "batch", "budget", "measured", "predicted", "ratio"], rows)]
    return out


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def point_commits(run_dir: Path, manifest: dict) -> str:
    """The commits the run's points were measured at, from each point's table metadata, with the
    notebooks each holds when there are several (a run resumed after a code change); ``""`` when
    no point records one."""
    by_sha: dict[str, list[str]] = {}
    for e in manifest["points"].values():
        side = (run_dir / e.get("results", "")).with_suffix(".meta.json")
        if e.get("status") != "ok" or not side.is_file():
            continue
        m = json.loads(side.read_text())
        sha = str(m.get("git_sha", "unknown"))[:12] + (" (dirty tree)" if m.get("git_dirty") else "")
        nb = Path(e["notebook"]).stem.split("_")[0]
        if nb not in by_sha.setdefault(sha, []):
            by_sha[sha].append(nb)
    if len(by_sha) <= 1:
        return next(iter(by_sha), "")
    return " and ".join(f"{sha} (notebooks {', '.join(sorted(nbs))})" for sha, nbs in by_sha.items())


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
    sha = point_commits(run_dir, manifest) or (str(meta.get("git_sha", "unknown"))[:12]
                                               + (" (dirty tree)" if meta.get("git_dirty") else ""))
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
                    f"within {TOLERANCE['tensor_flops']:.0%}; L2 reads shown for the picture: as the SMs receive "
                    f"them, and as the L2 slices serve them after the L2 request coalescer merged identical "
                    f"reads of co-resident blocks):", "",
                _table(["kernel", "shape", "DRAM bytes", "tensor FLOPs", "L2 -> SM reads", "L2 slices' reads"], cr)]
    out += engine_lines(combined) + moe_lines(combined)
    unfinished = sorted({f"`{Path(e['notebook']).stem}` ({e.get('status')})" for e in manifest["points"].values()
                         if e.get("status") != "ok"})
    if unfinished:
        out += ["", f"Not finished in this run, so without figures here: {', '.join(unfinished)}."]
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
