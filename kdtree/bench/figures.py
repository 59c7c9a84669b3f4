"""Static PNGs of a run's headline charts (for the README), drawn by headless Chromium.

    kdtree report <run-id> --png     ->  reports/<run-id>/figures/{roofline,tree_build,verify_latency}.png

Each chart is the same plotly figure the notebooks show, written to a page that loads the local
plotly.js and screenshotted; nothing is fetched from the network. Needs Debian's ``chromium``.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import plotly.graph_objects as go

from kdtree.bench import plots
from kdtree.bench.report import load_run, write_plotly_js

STATIC = {"displayModeBar": False, "staticPlot": True}


def headline_figures(run_dir: str | Path) -> dict[str, go.Figure]:
    """The run's headline charts by name: the verify-attention roofline, tree build time against
    the CPU paths, and verify-attention time against q_len in every timing mode over the launch
    floors (whichever the run has)."""
    df, ceilings, _ = load_run(run_dir)
    figs = {}
    if df.empty:
        return figs
    verify = df[df["kernel"] == "verify_attention"]
    if not verify.empty and (verify["flops"] > 0).any():
        figs["roofline"] = plots.roofline(verify, ceilings, "Verify attention on the measured roofline")
    build = df[df["kernel"] == "build"]
    if not build.empty:
        figs["tree_build"] = plots.latency(build, "budget", ["variant", "mode"], "Tree build time per call",
                                           ceilings, facet="batch")
    if not verify.empty and verify["q_len"].nunique() > 1:
        sweep = verify.groupby("point")["q_len"].nunique().idxmax()     # the q_len sweep
        figs["verify_latency"] = plots.latency(verify[verify["point"] == sweep], "q_len", ["variant", "mode"],
                                               "Verify attention time against q_len", ceilings, facet="l2")
    return figs


def export_pngs(run_dir: str | Path, out_dir: str | Path, *, width: int = 1400, height: int = 750,
                chromium: str | None = None) -> list[Path]:
    """Write each headline figure of ``run_dir`` as ``out_dir/<name>.png``.

    Raises
    ------
    ValueError
        When no Chromium is found (``apt-get install -y chromium``).
    """
    browser = chromium or shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise ValueError("export_pngs: no chromium on PATH (apt-get install -y chromium)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        js = write_plotly_js(tmp)
        for name, fig in headline_figures(run_dir).items():
            fig.update_layout(width=width - 20, height=height - 20)
            page = Path(tmp) / f"{name}.html"
            page.write_text(f'<html><head><meta charset="utf-8"><script src="{js.name}"></script></head>'
                            f'<body style="margin:0">{fig.to_html(full_html=False, include_plotlyjs=False, config=STATIC)}</body></html>')
            png = out_dir / f"{name}.png"
            subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            "--no-first-run", "--disable-background-networking", f"--window-size={width},{height}",
                            "--virtual-time-budget=10000", f"--screenshot={png}", page.as_uri()],
                           check=True, capture_output=True, timeout=120)
            written.append(png)
    return written
