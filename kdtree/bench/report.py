"""HTML reports of sweep runs: one page per executed notebook, a run index, a list of runs, and
regression reports comparing two runs.

Pages are nbconvert's lab template without input cells and without any network fetch: the
template (``templates/kdtree_report``) drops require.js, MathJax and mermaid and loads the one
shared ``reports/plotly.min.js`` and ``reports/notebook.css`` (the lab theme, linked rather than
inlined in every page). Layout::

    reports/index.html                 every run and comparison
    reports/plotly.min.js              shared by all pages
    reports/notebook.css               shared by all notebook pages
    reports/<run-id>/index.html        the run's summary notebook, with links to the pages below
    reports/<run-id>/<notebook>/<point>.html
    reports/compare-<a>-vs-<b>/index.html
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import pandas as pd

from kdtree.bench.ceilings import Ceilings
from kdtree.bench.plots import row_text
from kdtree.bench.roofline import COLUMNS as ROOF_COLUMNS
from kdtree.bench.roofline import classify
from kdtree.bench.sweep import DamagedRun, combine_results, read_manifest, summary

TEMPLATES = Path(__file__).resolve().parent / "templates"
PLOTLY_JS = "plotly.min.js"
NOTEBOOK_CSS = "notebook.css"
SUMMARY_NOTEBOOK = "99_summary.ipynb"
# Columns that hold measurements or what is derived from them; every other common column is a key.
MEASURED = {"median_us", "p20_us", "p80_us", "reps", "point", *ROOF_COLUMNS}

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<script src="{plotly}"></script>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}}
table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 6px}}
tr.slower td{{background:#fdd}}tr.faster td{{background:#dfd}}tr.failed td{{background:#fdd}}</style>
</head><body>{body}</body></html>
"""


def write_plotly_js(reports_root: str | Path) -> Path:
    """Write plotly's bundled plotly.js to ``reports_root/plotly.min.js`` (once per version)."""
    from plotly.offline import get_plotlyjs

    path = Path(reports_root) / PLOTLY_JS
    path.parent.mkdir(parents=True, exist_ok=True)
    js = get_plotlyjs()
    if not path.exists() or path.stat().st_size != len(js.encode()):
        path.write_text(js)
    return path


def write_assets(reports_root: str | Path) -> None:
    """Write the files every page shares: plotly.js and the lab theme's CSS."""
    from jupyter_core.paths import jupyter_path

    write_plotly_js(reports_root)
    static = next((Path(d) / "lab" / "static" for d in jupyter_path("nbconvert", "templates")
                   if (Path(d) / "lab" / "static" / "index.css").exists()), None)
    if static is None:
        raise FileNotFoundError("nbconvert's lab template (static/index.css) is not installed")
    css = (static / "index.css").read_text() + "\n" + (static / "theme-light.css").read_text()
    path = Path(reports_root) / NOTEBOOK_CSS
    if not path.exists() or path.read_text() != css:
        path.write_text(css)


def notebook_html(notebook: str | Path, out: str | Path, assets: str, nav_html: str = "") -> Path:
    """Render an executed notebook to HTML without input cells, offline.

    Parameters
    ----------
    notebook : path
        The executed ``.ipynb``.
    out : path
        The HTML file to write.
    assets : str
        Relative URL from ``out`` to the reports root, where plotly.js and the CSS live ("../").
    nav_html : str
        HTML inserted at the top of the page (links to the other pages of the run).
    """
    import nbformat
    from nbconvert import HTMLExporter

    from traitlets.config import Config

    # Input cells are excluded, so the per-page pygments stylesheet (CSSHTMLHeaderPreprocessor)
    # would only repeat itself on every page.
    cfg = Config({"CSSHTMLHeaderPreprocessor": {"enabled": False}})
    exporter = HTMLExporter(config=cfg, template_name="kdtree_report", extra_template_basedirs=[str(TEMPLATES)],
                            exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    nb = nbformat.read(str(notebook), as_version=4)
    body, _ = exporter.from_notebook_node(
        nb, resources={"plotly_src": assets + PLOTLY_JS, "css_href": assets + NOTEBOOK_CSS, "nav_html": nav_html,
                       "metadata": {"name": Path(notebook).stem}})
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(body)
    return out


def load_run(run_dir: str | Path) -> tuple[pd.DataFrame, Ceilings, dict]:
    """A run's timed results (every finished point) classified on its ceilings, the ceilings,
    and its manifest."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    ceilings = run_ceilings(run_dir)
    df = _timed(combine_results(run_dir))                   # damaged points are named and left out
    return (classify(df, ceilings) if not df.empty else df), ceilings, manifest


def run_ceilings(run_dir: str | Path) -> Ceilings:
    """The ceilings a run measured (its ``ceilings.json``).

    Raises
    ------
    DamagedRun
        A ``ValueError`` saying what to do, when the file is missing, empty or unreadable.
    """
    f = Path(run_dir) / "ceilings.json"
    name = Path(run_dir).resolve().name
    if not f.exists():
        raise DamagedRun(f"run {name}: no ceilings.json (its ceilings notebook has not finished); "
                         "resume the sweep to measure them")
    try:
        return Ceilings.load(f)
    except (ValueError, TypeError, AttributeError) as exc:
        why = "empty" if not f.read_text().strip() else " ".join(str(exc).split())[:200]
        raise DamagedRun(f"run {name}: ceilings.json is unreadable ({why}); resume the sweep "
                         "(same run id) to measure the ceilings again") from None


def _timed(df: pd.DataFrame) -> pd.DataFrame:
    """The rows that hold a time (a run's combined table also has the ceilings table's rows)."""
    if "median_us" not in df.columns:
        return pd.DataFrame()
    return df[df["median_us"].notna()].reset_index(drop=True)


def overview(manifest: dict) -> pd.DataFrame:
    """One row per point: notebook, parameters, status, seconds, error."""
    return pd.DataFrame([{"point": pid, "notebook": Path(e["notebook"]).stem, "status": e.get("status"),
                          "seconds": e.get("seconds"), "parameters": json.dumps(e.get("params", {})),
                          "error": e.get("error") or ""} for pid, e in manifest["points"].items()])


def headline(df: pd.DataFrame) -> pd.DataFrame:
    """Per kernel, variant, timing mode and L2 state: points, best rates, median fraction of the
    binding roof, the most common bound, and the diagnosis of the largest point."""
    if df.empty or "bound" not in df.columns:
        return pd.DataFrame()
    keys = [c for c in ("kernel", "variant", "path", "mode", "l2") if c in df.columns]
    d = df[df["bound"].notna()]
    rows = []
    for key, g in d.groupby(keys, dropna=False, sort=True):
        big = g.loc[(g["flops"] + g["bytes_min"]).idxmax()]
        rows.append({**dict(zip(keys, key if isinstance(key, tuple) else (key,))), "points": len(g),
                     "best_tflops": g["achieved_tflops"].max(), "best_tbs": g["achieved_tbs"].max(),
                     "median_fraction": g["fraction"].median(), "bound": g["bound"].mode().iat[0],
                     "diagnosis (largest point)": big["diagnosis"]})
    return pd.DataFrame(rows)


def _nav(run_id: str, manifest: dict, depth: int) -> str:
    up = "../" * depth
    items = []
    for pid, e in manifest["points"].items():
        status = e.get("status", "pending")
        params = html.escape(json.dumps(e.get("params", {})))
        link = (f'<a href="{up}{pid}.html">{html.escape(pid)}</a>' if status in ("ok", "failed")
                else html.escape(pid))
        items.append(f'<li class="{status}">{link} <b>{status}</b> <code>{params}</code>'
                     + (f' <i>{html.escape(e.get("error") or "")[:300]}</i>' if status == "failed" else "") + "</li>")
    return (f'<nav style="padding:1em 2em;border-bottom:1px solid #ccc"><b>run {html.escape(run_id)}</b> · '
            f'<a href="{up}index.html">run summary</a> · <a href="{up}../index.html">all runs</a>'
            f'<details><summary>pages ({len(items)})</summary><ul>{"".join(items)}</ul></details></nav>')


def render_run(run_dir: str | Path, reports_root: str | Path = "reports", *,
               summary_notebook: str | Path | None = None, kernel_name: str = "python3") -> Path:
    """Render a run: the summary notebook (executed now), one page per point, and the indexes.

    Returns the path of ``reports/<run-id>/index.html``.
    """
    import papermill as pm

    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    run_ceilings(run_dir)                                   # refuse a run without readable ceilings now
    run_id = manifest["run_id"]
    reports_root = Path(reports_root)
    out = reports_root / run_id
    write_assets(reports_root)
    summary_nb = Path(summary_notebook) if summary_notebook else _repo_notebook(manifest, SUMMARY_NOTEBOOK)
    executed = run_dir / "summary.ipynb"
    pm.execute_notebook(str(summary_nb), str(executed), parameters={"run_dir": "."}, cwd=str(run_dir),
                        kernel_name=kernel_name, progress_bar=False)
    for pid, e in manifest["points"].items():
        if e.get("status") in ("ok", "failed") and (run_dir / e["output"]).exists():
            depth = pid.count("/") + 1
            notebook_html(run_dir / e["output"], out / f"{pid}.html", "../" * depth,
                          _nav(run_id, manifest, depth))
    index = notebook_html(executed, out / "index.html", "../", _nav(run_id, manifest, 0))
    meta = manifest.get("metadata", {})
    (out / "run.json").write_text(json.dumps({"run_id": run_id, "device": meta.get("device"),
                                              "date": meta.get("date"), "git_sha": meta.get("git_sha"),
                                              **summary(run_dir)}, indent=2) + "\n")
    render_index(reports_root)
    return index


def _repo_notebook(manifest: dict, name: str) -> Path:
    spec = Path(manifest["spec_path"])
    for root in (spec.parent.parent, Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / "notebooks" / name).exists():
            return root / "notebooks" / name
    raise ValueError(f"cannot find notebooks/{name}; pass summary_notebook=")


def render_index(reports_root: str | Path = "reports") -> Path:
    """Write ``reports/index.html`` listing every rendered run and comparison, newest first."""
    reports_root = Path(reports_root)
    runs = []
    for f in reports_root.glob("*/run.json"):
        info = json.loads(f.read_text())
        runs.append(info)
    runs.sort(key=lambda r: r.get("date") or "", reverse=True)
    rows = "".join(
        f'<tr><td><a href="{html.escape(r["run_id"])}/index.html">{html.escape(r["run_id"])}</a></td>'
        f'<td>{html.escape(str(r.get("device")))}</td><td>{html.escape(str(r.get("date")))}</td>'
        f'<td>{html.escape(str(r.get("git_sha")))}</td><td>{html.escape(json.dumps(r.get("counts", {})))}</td></tr>'
        for r in runs)
    comps = "".join(f'<li><a href="{d.name}/index.html">{html.escape(d.name)}</a></li>'
                    for d in sorted(reports_root.glob("compare-*")) if (d / "index.html").exists())
    body = (f"<h1>kdtree workbook reports</h1><h2>Runs</h2><table><tr><th>run</th><th>device</th><th>date</th>"
            f"<th>git</th><th>points</th></tr>{rows}</table><h2>Comparisons</h2><ul>{comps or '<li>none</li>'}</ul>")
    path = reports_root / "index.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_PAGE.format(title="kdtree reports", plotly=PLOTLY_JS, body=body))
    return path


def compare_table(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Join two results tables on their common key columns; ratio = b / a of the medians.

    ``flag`` is ``slower`` where b's p20 is above a's p80, ``faster`` where b's p80 is below
    a's p20, and empty where the spreads overlap.
    """
    need = {"median_us", "p20_us", "p80_us"}
    for name, t in (("a", a), ("b", b)):
        if not need <= set(t.columns):
            raise ValueError(f"compare: table {name} lacks {sorted(need - set(t.columns))}")
    keys = [c for c in a.columns if c in b.columns and c not in MEASURED]
    if not keys:
        raise ValueError("compare: the tables share no key columns")
    cols = keys + sorted(need)
    m = a[cols].merge(b[cols], on=keys, suffixes=("_a", "_b"))
    m["ratio"] = m["median_us_b"] / m["median_us_a"]
    m["flag"] = np.where(m["p20_us_b"] > m["p80_us_a"], "slower",
                         np.where(m["p80_us_b"] < m["p20_us_a"], "faster", ""))
    return m.sort_values("ratio", ascending=False, ignore_index=True)


def compare_runs(run_a: str | Path, run_b: str | Path, reports_root: str | Path = "reports") -> Path:
    """Render ``reports/compare-<a>-vs-<b>/index.html``: the ratio b/a at every common point."""
    import plotly.graph_objects as go

    run_a, run_b = Path(run_a), Path(run_b)
    a, b = (_timed(combine_results(r)) for r in (run_a, run_b))
    if a.empty or b.empty:
        raise ValueError(f"compare: {run_a if a.empty else run_b} has no timed results")
    m = compare_table(a.drop(columns=["point"]), b.drop(columns=["point"]))
    ida, idb = read_manifest(run_a)["run_id"], read_manifest(run_b)["run_id"]
    dev = [read_manifest(r).get("metadata", {}).get("device") for r in (run_a, run_b)]
    fig = go.Figure()
    label_cols = [c for c in m.columns if c not in {"ratio", "flag"} and not c.endswith(("_a", "_b"))]
    for flag, g in m.groupby("flag", sort=True):
        fig.add_trace(go.Scatter(x=list(range(len(g))), y=g["ratio"], mode="markers", name=flag or "within spread",
                                 text=row_text(g, label_cols, named=True),
                                 hovertemplate="%{text}<br>ratio %{y:.3f}<extra></extra>"))
    fig.add_hline(y=1.0, line_dash="dash")
    fig.update_yaxes(type="log", title=f"time {idb} / time {ida}")
    fig.update_layout(template="plotly_white", title=f"{idb} vs {ida}<br><sup>{dev[1]} vs {dev[0]}; "
                      "flagged where the p20-p80 spreads do not overlap</sup>")
    out = Path(reports_root) / f"compare-{ida}-vs-{idb}" / "index.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_plotly_js(reports_root)
    flagged = m["flag"].ne("").sum()
    body = (f"<h1>{html.escape(idb)} against {html.escape(ida)}</h1>"
            f"<p>{len(m)} common points; {flagged} beyond the measured spread "
            f"({(m['flag'] == 'slower').sum()} slower, {(m['flag'] == 'faster').sum()} faster); "
            f"median ratio {m['ratio'].median():.3f}.</p>"
            + fig.to_html(full_html=False, include_plotlyjs=False) + _table_html(m, row_class="flag"))
    out.write_text(_PAGE.format(title=f"compare {ida} vs {idb}", plotly="../" + PLOTLY_JS, body=body))
    render_index(reports_root)
    return out


def _table_html(df: pd.DataFrame, row_class: str | None = None) -> str:
    """An HTML table of ``df``; each row gets the CSS class held in column ``row_class``."""
    def cell(v):
        return f"{v:.4g}" if isinstance(v, float) else html.escape(str(v))
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = "".join(f'<tr class="{html.escape(str(r[row_class])) if row_class else ""}">'
                   + "".join(f"<td>{cell(v)}</td>" for v in r.values()) + "</tr>"
                   for r in df.to_dict("records"))
    return f"<table><tr>{head}</tr>{body}</table>"
