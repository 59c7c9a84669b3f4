"""HTML reports of sweep runs: one page per executed notebook, a run index, a list of runs, and
regression reports comparing two runs.

Pages are nbconvert's lab template without input cells and without any network fetch: the
template (``templates/kdtree_report``) drops require.js, MathJax and mermaid and loads the one
shared ``reports/plotly.min.js`` and ``reports/notebook.css`` (the lab theme, linked rather than
inlined in every page). Layout::

    reports/index.html                 the published runs and comparisons (committed)
    reports/local.html                 every run and comparison in this folder (git-ignored)
    reports/plotly.min.js              shared by all pages
    reports/notebook.css               shared by all notebook pages
    reports/<run-id>/index.html        the run's summary notebook, with links to the pages below
    reports/<run-id>/<notebook>/<point>.html
    reports/compare-<a>-vs-<b>/index.html

A run or comparison rendered as usual is local: its pages link "all runs" to ``local.html``,
and nothing tracked changes (git ignores run and report folders). ``publish=True``
(``kdtree report <run-id> --publish``) marks it published, links its pages to ``index.html``
and rewrites ``index.html``; commit it with ``git add -f`` on the paths it prints.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd

from kdtree.bench import compare, compare_figures
from kdtree.bench.ceilings import Ceilings
from kdtree.bench.compare import compare_table
from kdtree.bench.display import display_table, fmt
from kdtree.bench.notebook_run import execute_notebook
from kdtree.bench.roofline import classify
from kdtree.bench.sweep import DamagedRun, combine_results, latest_run, read_manifest, summary

TEMPLATES = Path(__file__).resolve().parent / "templates"
PLOTLY_JS = "plotly.min.js"
NOTEBOOK_CSS = "notebook.css"
SUMMARY_NOTEBOOK = "99_summary.ipynb"
INDEX, LOCAL_INDEX = "index.html", "local.html"
RUNS = "parameterized_runs"

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<script src="{plotly}"></script>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}}
table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 6px}}
th{{background:#f4f4f4;text-align:left}}tr.slower td{{background:#fdd}}tr.faster td{{background:#dfd}}
tr.failed td{{background:#fdd}}.warning{{background:#fff3cd;border:1px solid #e0c060;padding:.6em 1em}}
nav{{padding:.5em 0 1em;border-bottom:1px solid #ccc;margin-bottom:1em}}</style>
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
    combined = combine_results(run_dir)                     # damaged points are named and left out
    df = _timed(combined)
    return (classify(df, ceilings, counters=combined) if not df.empty else df), ceilings, manifest


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
                     "best_tflops": g.loc[g["flops"] > 0, "achieved_tflops"].max(),   # none: no FLOPs
                     "best_tbs": g["achieved_tbs"].max(),
                     "median_fraction": g["fraction"].median(), "bound": g["bound"].mode().iat[0],
                     "diagnosis (largest point)": big["diagnosis"]})
    return pd.DataFrame(rows)


def _nav(run_id: str, manifest: dict, page: str, pages: set[str], all_runs: str) -> str:
    """The navigation bar of one page of a run.

    ``page`` is the page's path inside the run's report folder (``index.html`` or
    ``<notebook>/<point>.html``), ``pages`` the point ids that have a page, ``all_runs`` the file
    name of the list of runs in the reports root. Links are relative to the page.
    """
    to_run = "../" * page.count("/")                 # from the page up to reports/<run-id>/
    items = []
    for pid, e in manifest["points"].items():
        status = e.get("status", "pending")
        params = html.escape(json.dumps(e.get("params", {})))
        link = f'<a href="{to_run}{html.escape(pid)}.html">{html.escape(pid)}</a>' if pid in pages else html.escape(pid)
        items.append(f'<li class="{status}">{link} <b>{status}</b> <code>{params}</code>'
                     + (f' <i>{html.escape(e.get("error") or "")[:300]}</i>' if status == "failed" else "") + "</li>")
    return (f'<nav style="padding:1em 2em;border-bottom:1px solid #ccc"><b>run {html.escape(run_id)}</b> · '
            f'<a href="{to_run}index.html">run summary</a> · <a href="{to_run}../{all_runs}">all runs</a>'
            f'<details><summary>pages ({len(items)})</summary><ul>{"".join(items)}</ul></details></nav>')


def render_run(run_dir: str | Path, reports_root: str | Path = "reports", *,
               summary_notebook: str | Path | None = None, kernel_name: str = "python3",
               publish: bool = False) -> Path:
    """Render a run: the summary notebook (executed now), one page per point, and the indexes.

    ``publish``: list the run in ``reports/index.html`` (the committed list) and link its pages
    there (a run published once stays so); otherwise it is listed in ``reports/local.html``
    only, and no tracked file changes. The executed summary notebook goes to
    ``reports/<run-id>/summary.ipynb``: rendering never writes into the run folder.
    Returns the path of ``reports/<run-id>/index.html``.
    """
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    run_ceilings(run_dir)                                   # refuse a run without readable ceilings now
    run_id = manifest["run_id"]
    reports_root = Path(reports_root)
    out = reports_root / run_id
    write_assets(reports_root)
    summary_nb = Path(summary_notebook) if summary_notebook else _repo_notebook(manifest, SUMMARY_NOTEBOOK)
    executed = out / "summary.ipynb"    # beside the pages: rendering never writes into the run folder
    out.mkdir(parents=True, exist_ok=True)
    # The sweep's quiet executor: kernel over IPC (no TCP warning), its start-up log filtered.
    execute_notebook(str(summary_nb), str(executed), parameters={"run_dir": "."}, cwd=str(run_dir),
                     kernel_name=kernel_name, timeout=None, label=f"{run_id} summary")
    pages = {pid for pid, e in manifest["points"].items()
             if e.get("status") in ("ok", "failed") and e.get("output") and (run_dir / e["output"]).exists()}
    publish = publish or _published(out / "run.json")          # once published, a re-render keeps it listed
    all_runs = INDEX if publish else LOCAL_INDEX
    for pid in sorted(pages):
        page = f"{pid}.html"
        notebook_html(run_dir / manifest["points"][pid]["output"], out / page, "../" * (page.count("/") + 1),
                      _nav(run_id, manifest, page, pages, all_runs))
    index = notebook_html(executed, out / "index.html", "../", _nav(run_id, manifest, "index.html", pages, all_runs))
    meta = manifest.get("metadata", {})
    (out / "run.json").write_text(json.dumps({"run_id": run_id, "device": meta.get("device"),
                                              "date": meta.get("date"), "git_sha": meta.get("git_sha"),
                                              "published": publish, **summary(run_dir)}, indent=2) + "\n")
    render_index(reports_root, publish=publish)
    return index


def _repo_notebook(manifest: dict, name: str) -> Path:
    spec = Path(manifest["spec_path"])
    for root in (spec.parent.parent, Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / "notebooks" / name).exists():
            return root / "notebooks" / name
    raise ValueError(f"cannot find notebooks/{name}; pass summary_notebook=")


def _published(info: Path) -> bool:
    """Whether the run.json / compare.json of a rendered report marks it published."""
    return info.exists() and bool(json.loads(info.read_text()).get("published"))


def render_index(reports_root: str | Path = "reports", publish: bool = False) -> Path:
    """Write ``reports/local.html``: every rendered run and comparison in the folder, newest
    first. With ``publish`` (or where the folder has none yet) also ``reports/index.html``, the
    committed list: the published ones only. Returns the path of ``local.html``."""
    reports_root = Path(reports_root)
    reports_root.mkdir(parents=True, exist_ok=True)
    runs = sorted((json.loads(f.read_text()) for f in reports_root.glob("*/run.json")),
                  key=lambda r: r.get("date") or "", reverse=True)
    comps = sorted((json.loads(f.read_text()) for f in reports_root.glob("compare-*/compare.json")),
                   key=lambda c: c["name"])
    local = reports_root / LOCAL_INDEX
    local.write_text(_index_page(runs, comps, published_only=False))
    if publish or not (reports_root / INDEX).exists():
        (reports_root / INDEX).write_text(_index_page(runs, comps, published_only=True))
    return local


def _index_page(runs: list[dict], comps: list[dict], published_only: bool) -> str:
    """The list of runs and comparisons (all, or the published ones) as an HTML page."""
    if published_only:
        runs, comps = [r for r in runs if r.get("published")], [c for c in comps if c.get("published")]
    tag = (lambda r: "") if published_only else (lambda r: " (published)" if r.get("published") else "")
    rows = "".join(
        f'<tr><td><a href="{html.escape(r["run_id"])}/index.html">{html.escape(r["run_id"])}</a>{tag(r)}</td>'
        f'<td>{html.escape(str(r.get("device")))}</td><td>{html.escape(str(r.get("date")))}</td>'
        f'<td>{html.escape(str(r.get("git_sha")))}</td>'
        f'<td>{html.escape(", ".join(f"{k} {v}" for k, v in (r.get("counts") or {}).items()))}</td></tr>'
        for r in runs)
    items = "".join(f'<li><a href="{html.escape(c["name"])}/index.html">{html.escape(c["title"])}</a>{tag(c)}: '
                    f'{html.escape(c.get("line", ""))}</li>' for c in comps)
    what = ("The published runs and comparisons (committed with the repository)." if published_only else
            "Every run and comparison rendered into this folder, published or local. "
            f'<a href="{INDEX}">The published ones</a>.')
    body = (f"<h1>kdtree workbook reports</h1><p>{what}</p><h2>Runs</h2><table><tr><th>run</th><th>device</th>"
            f"<th>date (UTC)</th><th>git commit</th><th>points</th></tr>{rows}</table>"
            f"<h2>Comparisons</h2><ul>{items or '<li>none</li>'}</ul>")
    return _PAGE.format(title="kdtree reports", plotly=PLOTLY_JS, body=body)


def find_run(run_dir: str | Path = "", start: str | Path | None = None) -> Path:
    """``run_dir`` if given, else the latest run under ``parameterized_runs/`` of the nearest
    folder at or above ``start`` (default: the working folder) that has one, so that a notebook
    opened by hand from ``notebooks/`` finds the repository's runs.

    Raises
    ------
    ValueError
        When no run is found.
    """
    if run_dir:
        return Path(run_dir)
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / RUNS).is_dir() and (found := latest_run(folder / RUNS)) is not None:
            return found
    raise ValueError(f"no sweep run under {RUNS}/ in {here} or any folder above it; "
                     "run a sweep first or set run_dir")


def _measured(df: pd.DataFrame) -> pd.DataFrame:
    """The rows that hold one of the compared metrics (not the ceilings table's rows)."""
    cols = [m for m in compare.METRICS if m in df.columns]
    return df[df[cols].notna().any(axis=1)].reset_index(drop=True) if cols else pd.DataFrame()


def compare_runs(run_a: str | Path, run_b: str | Path, reports_root: str | Path = "reports", *,
                 publish: bool = False) -> Path:
    """Render ``reports/compare-<a>-vs-<b>/index.html``: what changed from run a to run b.

    The page leads with the summary (points compared, faster, slower, unchanged, the families
    that moved as a whole, the largest changes, the noise model and its thresholds) and a
    warning when the runs ran on different devices, then two charts of bounded height (the
    flagged points labelled by point; every point on one row per noise family:
    :mod:`kdtree.bench.compare_figures`), the noise per family, then the tables: key columns,
    both values, ratio and flag first. The terminal summary is written
    beside it as ``summary.txt``; ``publish`` lists the comparison in ``reports/index.html``.

    Raises
    ------
    ValueError
        When a run has no measured rows or the runs have no point in common.
    """
    run_a, run_b = Path(run_a), Path(run_b)
    a, b = (_measured(combine_results(r)) for r in (run_a, run_b))
    if a.empty or b.empty:
        raise ValueError(f"compare: {run_a if a.empty else run_b} has no timed results")
    t = compare_table(a, b)
    ma, mb = read_manifest(run_a), read_manifest(run_b)
    ida, idb = ma["run_id"], mb["run_id"]
    dev = [m.get("metadata", {}).get("device") for m in (ma, mb)]
    warnings = ([(f"the runs ran on different devices ({ida}: {dev[0]}; {idb}: {dev[1]}): the ratios mix "
                  "hardware with code changes")] if dev[0] != dev[1] else [])
    text = compare.summary_text(t, ida, idb, warnings)
    s = compare.summary(t)
    root = Path(reports_root)
    name = f"compare-{ida}-vs-{idb}"
    out = root / name / "index.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_plotly_js(root)
    publish = publish or _published(out.parent / "compare.json")
    links = " · ".join(f'<a href="../{r}/index.html">{r}</a>' for r in (ida, idb) if (root / r / "index.html").exists())
    body = (f'<nav><a href="../{INDEX if publish else LOCAL_INDEX}">all runs</a>{" · " + links if links else ""}</nav>'
            f"<h1>{html.escape(idb)} against {html.escape(ida)}</h1>"
            + "".join(f'<p class="warning"><b>Warning:</b> {html.escape(w)}</p>' for w in warnings)
            + f"<p><b>{s['compared']} points compared: {s['faster']} faster, {s['slower']} slower, "
              f"{s['unchanged']} unchanged</b>"
            + (f" ({s['with family']} of them in families that moved as a whole)" if s["with family"] else "")
            + (f", {s['not comparable']} not comparable (a value not positive, or no noise estimate)"
               if s["not comparable"] else "")
            + (f"; {s['derived']} rows computed from others left out" if s["derived"] else "")
            + (f"; {s['only in a']} only in {html.escape(ida)}" if s["only in a"] else "")
            + (f"; {s['only in b']} only in {html.escape(idb)}" if s["only in b"] else "")
            + f". Devices: {html.escape(str(dev[0]))} ({html.escape(ida)}), {html.escape(str(dev[1]))} "
              f"({html.escape(idb)}).</p><p>{html.escape(compare.rule_text(s['sigma']))}.</p>"
            + ("<p>Families that moved as a whole (the machine, or a change common to every point; their "
               "points are judged against the shift):</p><ul>"
               + "".join(f"<li>{html.escape(x)}</li>" for x in s["shifts"]) + "</ul>" if s["shifts"] else "")
            + "<p>Largest changes:</p><ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in s["largest"]) + "</ul>"
            + "".join(fig.to_html(full_html=False, include_plotlyjs=False,
                                  config={"displaylogo": False, "displayModeBar": False})
                      for fig in (compare_figures.flagged_chart(t, ida, idb), compare_figures.family_strip(t, ida, idb)))
            + "<h2>The noise between the runs, per family</h2>"
              "<p>Per family: its points, the shift of its median (reported or not), the core scatter (from the "
              f"median absolute deviation), the tail scatter (within which {compare.TAIL_Q:.0%} of its points "
              "agree), the sigma used (the larger), the band a point must leave to be flagged, and the points "
              "flagged. A tail scatter well above the core scatter means a part of the family moved: "
              "interference on the host, or a change to a part of it.</p>"
            + _table_html(_family_display(compare.family_table(t)))
            + "<h2>Every compared point</h2>"
            + "".join(f"<h3>{html.escape(group)}</h3>" + _table_html(_compare_display(g), row_class=list(g["flag"]))
                      for group, g in _groups(t)))
    out.write_text(_PAGE.format(title=f"compare {ida} vs {idb}", plotly="../" + PLOTLY_JS, body=body))
    (out.parent / "summary.txt").write_text(text + "\n")
    (out.parent / "compare.json").write_text(json.dumps(
        {"name": name, "title": f"{idb} against {ida}", "published": publish,
         "line": f"{s['compared']} points: {s['faster']} faster, {s['slower']} slower, {s['unchanged']} unchanged"
                 + ("; different devices" if warnings else "")}, indent=2) + "\n")
    render_index(root, publish=publish)
    return out


def _groups(t: pd.DataFrame):
    """(title, rows) per kernel, and per engine table for the engine's rows, in table order."""
    kernel = t["kernel"] if "kernel" in t.columns else pd.Series(pd.NA, index=t.index)
    table = t["table"] if "table" in t.columns else pd.Series(pd.NA, index=t.index)
    group = kernel.fillna(table.map(lambda x: f"engine {x}" if isinstance(x, str) else "other")).fillna("other")
    for name in dict.fromkeys(group):
        yield str(name), t[group == name]


def _family_display(f: pd.DataFrame) -> pd.DataFrame:
    """:func:`kdtree.bench.compare.family_table` for reading: scatters as percentages, ratios as factors."""
    return pd.DataFrame({
        "metric": [compare.METRICS[m][0] for m in f["metric"]], "family": f["family"], "points": f["points"],
        "shift (b/a)": [fmt(v, "x") + ("" if rep else " (not reported)") for v, rep in zip(f["shift"], f["shift reported"])],
        "core scatter": [fmt(v, "%") for v in f["core"]], "tail scatter": [fmt(v, "%") for v in f["tail"]],
        "sigma": [fmt(v, "%") for v in f["sigma"]], "band (x)": [fmt(v, "x") for v in f["band"]],
        "slower": f["slower"], "faster": f["faster"]}).astype(str)


def _compare_display(t: pd.DataFrame) -> pd.DataFrame:
    """Compared rows for reading: their key columns (those they fill), the metric, both values
    with units, ratio and flag first; then the spreads and the noise band; no empty column."""
    keys = [k for k in t.attrs.get("keys", compare.KEYS)
            if k in t.columns and k not in ("kernel", "table") and not t[k].map(lambda v: pd.isna(v) or v in ("", "n/a")).all()]
    d = display_table(t[keys]) if keys else pd.DataFrame(index=range(len(t)))
    d["metric"] = [compare.METRICS[m][0] for m in t["metric"]]
    for col in ("a", "b"):
        d[col] = [compare.value_text(m, v) for m, v in zip(t["metric"], t[col])]
    d["ratio b/a"] = [fmt(r, "x") for r in t["ratio"]]
    d["flag"] = t["flag"].replace({"": "-"}).to_numpy()
    d["family shift"] = [fmt(v, "x") for v in t["family_shift"]]
    for col in ("a_p20", "a_p80", "b_p20", "b_p80"):
        if col in t.columns:
            d[col.replace("_", " ")] = [compare.value_text(m, v) for m, v in zip(t["metric"], t[col])]
    d["noise band (ratio)"] = ["" if pd.isna(lo) else f"{lo:.3g}x - {hi:.3g}x"     # none: no noise estimate
                               for lo, hi in zip(t["band_lo"], t["band_hi"])]
    if (d["metric"] == d["metric"].iat[0]).all():
        d = d.drop(columns="metric")
    return d[[c for c in d.columns if not d[c].eq("").all()]]


def _table_html(df: pd.DataFrame, row_class: list[str] | None = None) -> str:
    """An HTML table of ``df`` (cells already formatted, :func:`display_table`); row ``i`` gets
    the CSS class ``row_class[i]``."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    classes = row_class or [""] * len(df)
    body = "".join(f'<tr class="{html.escape(str(cls))}">' + "".join(f"<td>{html.escape(str(v))}</td>" for v in r)
                   + "</tr>" for cls, r in zip(classes, df.itertuples(index=False)))
    return f"<table><tr>{head}</tr>{body}</table>"
