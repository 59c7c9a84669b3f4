"""Figures of the workbook (plotly), each labelled with device, ceilings, L2 state and timing mode.

Every chart of a run follows the same conventions, so the charts read together:

- a variant keeps one colour and one marker in every chart (:func:`variant_style`: a fixed
  Okabe-Ito map for the package's variants; any other name gets a colour of its own set chosen by
  a hash of the name, so it too keeps its colour from chart to chart);
- the timing mode (graph, eager, host) changes the line dash and the marker fill, never the
  colour; the L2 state gets its own panel (line charts) or the marker fill (the roofline);
- the legend lists each variant once, plus a grey key of the dashes and fills;
- every reference line (a roof, a launch floor, a figure of the paper) is grey, has a dash of
  its own and carries its label on the line;
- the first subtitle line says what the chart shows that the run's other charts do not; the
  second names the device, the ceilings, the L2 state and the timing mode.

``show(fig)`` is the explicit renderer every notebook uses: it emits plotly's own mime type
(JupyterLab draws it) next to a ``text/html`` div whose script calls the global ``Plotly``.
nbconvert keeps the HTML, and the report pages load one local ``plotly.min.js`` in their head,
so the plots draw offline. (plotly's default notebook renderer wraps its call in require.js,
which nbconvert's output never configures: the plots come out blank.)
"""
from __future__ import annotations

import math
import uuid
import zlib

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kdtree.bench.ceilings import Ceilings
from kdtree.bench.display import COLUMNS, display_table, eng, fmt
from kdtree.bench.models import kernel_name
from kdtree.bench.roofline import ROOF_LABELS, roof_lines

# Okabe & Ito's colour-blind-safe palette.
BLUE, VERMILLION, GREEN, PURPLE, ORANGE, SKY, BLACK, YELLOW = (
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
# The package's variants: verify attention (one family) and the tree kernels (another; the two
# never share a chart).
VARIANT_STYLES = {
    "fused": (BLUE, "circle"), "fused_mma": (SKY, "square"), "cascade": (GREEN, "diamond"),
    "naive": (VERMILLION, "triangle-up"), "torch": (BLACK, "x"),
    "gpu": (BLUE, "circle"), "gpu_heap": (SKY, "triangle-down"), "cpu_paper": (ORANGE, "square"),
    "cpu_serving": (PURPLE, "diamond"),
}
# Any other name (a new variant, an engine accuracy label) hashes into these: Okabe-Ito's colours
# that the map above leaves free, then Paul Tol's muted set (also colour-blind safe).
OTHER_COLORS = (YELLOW, "#882255", "#44AA99", "#999933", "#332288", "#DDCC77", "#AA4499", "#117733")
OTHER_SYMBOLS = ("star", "hexagon", "pentagon", "cross", "triangle-left", "triangle-right", "hourglass", "bowtie")
MODE_DASH = {"graph": "solid", "eager": "dash", "host": "dot"}
MODE_OPEN = {"graph": False, "eager": True, "host": False}     # eager markers hollow
L2_OPEN = {"cold": False, "warm": True, "n/a": False}          # on the roofline: warm hollow
EXTRA_DASH = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
REFERENCE_DASH = ("longdash", "dot", "dashdot", "longdashdot", "dash")
REFERENCE_COLOR = "#6b6b6b"
KEY_COLOR = "#888888"
_ROOF_DASH = {"hbm": "longdash", "l2": "dot", "tensor": "solid", "fp32": "dashdot"}


def variant_style(name) -> tuple[str, str]:
    """(colour, marker symbol) of a variant: fixed for the package's variants, by a hash of the
    name for any other, so a name has the same style in every chart."""
    name = str(name)
    if name in VARIANT_STYLES:
        return VARIANT_STYLES[name]
    h = zlib.crc32(name.encode())
    return OTHER_COLORS[h % len(OTHER_COLORS)], OTHER_SYMBOLS[(h // len(OTHER_COLORS)) % len(OTHER_SYMBOLS)]


def _states(df: pd.DataFrame, col: str) -> str:
    if col not in df.columns or df.empty:
        return "n/a"
    return "+".join(sorted(str(v) for v in df[col].dropna().unique())) or "n/a"


def caption(ceilings: Ceilings, df: pd.DataFrame | None = None) -> str:
    """Subtitle naming the device and ceilings plus the L2 state(s) and timing mode(s) of ``df``."""
    states = "" if df is None else f" | L2: {_states(df, 'l2')} | timing: {_states(df, 'mode')}"
    return ceilings.caption() + states


def label(fig: go.Figure, title: str, ceilings: Ceilings, df: pd.DataFrame | None = None,
          note: str = "") -> go.Figure:
    """Put ``title``, ``note`` (what this chart shows that the others do not) and the caption
    (device, ceilings, L2 state, timing mode) on ``fig``; a compact horizontal legend below."""
    sub = (f"<br><sup>{note}</sup>" if note else "") + f"<br><sup>{caption(ceilings, df)}</sup>"
    fig.update_layout(title={"text": title + sub, "x": 0.01}, height=fig.layout.height or 540,
                      margin={"t": 130 if note else 100, "b": 40}, template="plotly_white",
                      legend={"orientation": "h", "x": 0, "xanchor": "left", "y": -0.14, "yanchor": "top",
                              "font": {"size": 11}, "groupclick": "togglegroup", "traceorder": "normal"})
    fig.layout.meta = {"kdtree_caption": caption(ceilings, df), "kdtree_note": note}
    return fig


def show(fig: go.Figure) -> None:
    """Display ``fig`` so that JupyterLab and the offline HTML reports both draw it."""
    from IPython.display import display

    div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"kdtree-{uuid.uuid4().hex[:12]}",
                      config={"displaylogo": False, "responsive": True})
    display({"application/vnd.plotly.v1+json": fig.to_plotly_json(), "text/html": div,
             "text/plain": f"<figure: {fig.layout.title.text or ''}>"}, raw=True)


def table(df: pd.DataFrame, columns: list[str] | None = None):
    """A table for notebooks: chosen columns, units in the headers, engineering formatting
    (:func:`kdtree.bench.display.display_table`), no all-empty column, text never truncated."""
    return (display_table(df, columns).style.hide(axis="index")
            .set_properties(**{"text-align": "left", "white-space": "normal"}))


def row_text(df: pd.DataFrame, cols: list[str], sep: str = " ", named: bool = False) -> pd.Series:
    """One string per row from ``cols`` (missing values left out), formatted with the columns'
    units, for legends and hover text."""
    def cell(k, v):
        _, unit, scale = COLUMNS.get(k, (k, "", 1.0))
        return fmt(v, unit, scale)
    return df[cols].apply(lambda r: sep.join(f"{k}={cell(k, v)}" if named else cell(k, v)
                                             for k, v in r.items() if not pd.isna(v)), axis=1)


def _sorted(values) -> list:
    try:
        return sorted(values)
    except TypeError:    # mixed types
        return sorted(values, key=str)


def _tuple(key) -> tuple:
    return key if isinstance(key, tuple) else (key,)


def _axis(kind: str, col: int) -> str:
    return kind if col == 1 else f"{kind}{col}"


def reference_line(fig: go.Figure, name: str, x0: float, x1: float, y0: float, y1: float, *, dash: str,
                   log_x: bool, log_y: bool, col: int = 1, at: float = 0.98, anchor: str = "right",
                   below: bool = False) -> None:
    """A grey reference line from (x0, y0) to (x1, y1) in panel ``col``, labelled on the line.

    The label sits at fraction ``at`` of the way along the line (in the axes' own scale; plotly
    hides a label placed exactly at the end of an axis), above it or ``below`` it.
    The trace carries ``meta={"reference": name}`` so that tests and readers can find it.
    """
    fig.add_trace(go.Scatter(x=[x0, x1], y=[y0, y1], mode="lines", name=name, showlegend=False,
                             meta={"reference": name}, hovertemplate=f"{name}<extra></extra>",
                             line={"dash": dash, "color": REFERENCE_COLOR, "width": 1.5},
                             xaxis=_axis("x", col), yaxis=_axis("y", col)))

    def along(a, b, log):
        a, b = (math.log10(a), math.log10(b)) if log else (a, b)
        return a + at * (b - a)          # annotation coordinates on a log axis are log10 values
    fig.add_annotation(x=along(x0, x1, log_x), y=along(y0, y1, log_y), xref=_axis("x", col), yref=_axis("y", col),
                       text=name, showarrow=False, xanchor=anchor, yanchor="top" if below else "bottom",
                       font={"size": 11, "color": REFERENCE_COLOR})


def _key(fig: go.Figure, text: str, line: dict | None = None, marker: dict | None = None) -> None:
    """A legend-only grey entry explaining a dash or a fill."""
    fig.add_trace(go.Scatter(x=[None], y=[None], name=text, legendgroup="key", legendrank=2000,
                             mode="lines+markers" if line else "markers",
                             line=line or {}, marker={"color": KEY_COLOR, "size": 8, **(marker or {})}))


def _entry(fig: go.Figure, name: str, line: bool) -> None:
    """The legend entry of a variant (its colour and marker, solid and filled); clicking it
    shows or hides every trace of the variant."""
    color, symbol = variant_style(name)
    fig.add_trace(go.Scatter(x=[None], y=[None], name=name, legendgroup=name, legendrank=1000,
                             mode="lines+markers" if line else "markers", line={"color": color},
                             marker={"color": color, "symbol": symbol, "size": 9}))


def _symbol(symbol: str, hollow: bool) -> str:
    return f"{symbol}-open" if hollow else symbol


def lines(df: pd.DataFrame, x: str, y: str, by: list[str], title: str, ceilings: Ceilings, *,
          y_title: str, facet: str | None = None, log_x: bool = True, log_y: bool = True,
          spread: bool = True, hlines: dict[str, float] | None = None, note: str = "") -> go.Figure:
    """One line per combination of ``by`` columns, with p20-p80 error bars for time columns.

    The first ``by`` column names what a line is (colour and marker, :func:`variant_style`);
    ``mode`` among the others sets the marker fill (and the dash, when nothing else needs it);
    any other ``by`` column sets the dash.

    Parameters
    ----------
    df : DataFrame
        Tidy results; ``x``, ``y``, the ``by`` columns and ``facet`` must exist.
    facet : str, optional
        One panel per value of this column (shared y axis).
    hlines : dict, optional
        Horizontal reference lines (name -> value), labelled on the line, in every panel.
    note : str
        What this chart shows that the run's other charts do not (first subtitle line).
    """
    from plotly.subplots import make_subplots

    missing = [c for c in [x, y, *by, *([facet] if facet else [])] if c not in df.columns]
    if missing:
        raise ValueError(f"lines: columns {missing} not in the table ({list(df.columns)})")
    if not by:
        raise ValueError("lines: by needs at least one column (what a line is)")
    rest = list(by[1:])
    mode = "mode" if "mode" in rest else None
    extras = [c for c in rest if c != mode]
    d = df.sort_values(x)
    panels = _sorted(d[facet].dropna().unique()) if facet else [None]
    fig = make_subplots(rows=1, cols=len(panels), shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=[f"{COLUMNS.get(facet, (facet,))[0]} = {fmt(p)}" for p in panels]
                        if facet else None)
    extra_keys = [_tuple(k) for k, _ in d.groupby(extras, sort=True, dropna=False)] if extras else []
    extra_dash = {k: EXTRA_DASH[i % len(EXTRA_DASH)] for i, k in enumerate(extra_keys)}
    shown = set()
    for col, panel in enumerate(panels, start=1):
        part = d if facet is None else d[d[facet] == panel]
        for key, g in part.groupby(by, sort=True, dropna=False):
            key = _tuple(key)
            name = str(key[0])
            state = dict(zip(rest, key[1:]))
            color, symbol = variant_style(name)
            m = state.get(mode) if mode else None
            dash = extra_dash[tuple(state[c] for c in extras)] if extras else MODE_DASH.get(m, "solid")
            err = None
            if spread and y == "median_us" and {"p20_us", "p80_us"} <= set(g.columns):
                err = {"type": "data", "symmetric": False, "array": g["p80_us"] - g["median_us"],
                       "arrayminus": g["median_us"] - g["p20_us"], "thickness": 1}
            hover = row_text(g, [c for c in [*by, x, y] if c in g.columns], "<br>", named=True)
            if name not in shown:
                _entry(fig, name, line=True)
                shown.add(name)
            fig.add_trace(go.Scatter(x=g[x], y=g[y], mode="lines+markers", name=name, legendgroup=name,
                                     showlegend=False, error_y=err, text=hover,
                                     hovertemplate="%{text}<extra></extra>",
                                     line={"color": color, "dash": dash, "width": 2},
                                     marker={"color": color, "size": 8,
                                             "symbol": _symbol(symbol, MODE_OPEN.get(m, False))}),
                          row=1, col=col)
        xs = part[x].dropna()
        for i, (ref, v) in enumerate((hlines or {}).items()):
            if len(xs) and math.isfinite(v) and (v > 0 or not log_y):
                reference_line(fig, ref, xs.min(), xs.max(), v, v, dash=REFERENCE_DASH[i % len(REFERENCE_DASH)],
                               log_x=log_x, log_y=log_y, col=col)
    if mode:
        for m in _sorted(d[mode].dropna().unique()):
            _key(fig, f"{m}{' (hollow)' if MODE_OPEN.get(m) else ''}",
                 line=None if extras else {"color": KEY_COLOR, "dash": MODE_DASH.get(m, "solid")},
                 marker={"symbol": _symbol("circle", MODE_OPEN.get(m, False))})
    for k, dash in extra_dash.items():
        _key(fig, row_text(pd.DataFrame([k], columns=extras), extras, named=True).iat[0],
             line={"color": KEY_COLOR, "dash": dash})
    fig.update_xaxes(title=COLUMNS.get(x, (x,))[0], type="log" if log_x else "linear")
    fig.update_yaxes(type="log" if log_y else "linear")
    fig.update_yaxes(title=y_title, row=1, col=1)
    return label(fig, title, ceilings, df, note)


def varying(df: pd.DataFrame, dims, exclude: str | None = None) -> list[str]:
    """The columns among ``dims`` (other than ``exclude``) that take more than one value in ``df``."""
    return [c for c in dims if c != exclude and c in df.columns and df[c].nunique() > 1]


def launch_floors(df: pd.DataFrame, ceilings: Ceilings) -> dict[str, float]:
    """The floors under ``df``'s timing modes, by label: one graph launch, the host floor of an
    eager call of the table's op (of a bare launch when the table mixes ops), and the torch op
    overhead for host-timed rows on CPU ceilings."""
    modes = set(df["mode"].dropna()) if "mode" in df.columns else set()
    kernels = set(df["kernel"].dropna()) if "kernel" in df.columns else set()
    out = {}
    if "graph" in modes and math.isfinite(ceilings.launch_graph_us):
        out[f"graph launch {eng(ceilings.launch_graph_us * 1e-6, 's')}"] = ceilings.launch_graph_us
    if "eager" in modes:
        op = kernel_name(next(iter(kernels))) if len(kernels) == 1 else None
        v = ceilings.eager_floor(op) if op else ceilings.launch_eager_us
        out[f"eager floor{' of ' + op if op else ' (one launch)'} {eng(v * 1e-6, 's')}"] = v
    if "host" in modes and ceilings.kind == "cpu":
        out[f"torch op overhead {eng(ceilings.launch_eager_us * 1e-6, 's')}"] = ceilings.launch_eager_us
    return out


def latency(df: pd.DataFrame, x: str, by: list[str], title: str, ceilings: Ceilings,
            facet: str | None = None, note: str = "") -> go.Figure:
    """Median latency (p20-p80 bars) against ``x``, one line per ``by`` combination, over the
    launch floors of the timing modes shown (:func:`launch_floors`), each labelled."""
    note = note or (f"time per call against {x}, every timing mode; a line that runs along its "
                    "floor is launch- or dispatch-bound")
    return lines(df, x, "median_us", by, title, ceilings, y_title="time per call (us)", facet=facet,
                 hlines=launch_floors(df, ceilings), note=note)


def bandwidth(df: pd.DataFrame, x: str, by: list[str], title: str, ceilings: Ceilings,
              facet: str | None = None, note: str = "") -> go.Figure:
    """Achieved bandwidth on the minimum bytes against ``x``, with the HBM and L2 ceilings."""
    note = note or "the minimum bytes over the time: how close each variant gets to the HBM and L2 ceilings"
    return lines(df, x, "achieved_tbs", by, title, ceilings, y_title="TB/s (minimum bytes / time)",
                 facet=facet, spread=False, note=note,
                 hlines={f"HBM {eng(ceilings.hbm_bw, 'B/s')} (measured)": ceilings.hbm_bw / 1e12,
                         f"L2 {eng(ceilings.l2_bw, 'B/s')} (measured)": ceilings.l2_bw / 1e12})


def dispatch_overhead(df: pd.DataFrame, x: str, by: list[str], title: str, ceilings: Ceilings,
                      facet: str | None = None) -> go.Figure:
    """What an eager call costs beyond its graph replay (eager minus graph median, in us)
    against ``x``, over the measured eager launch latency: the host side of each kernel."""
    if "mode" not in df.columns:
        raise ValueError("dispatch_overhead: the table needs a 'mode' column")
    keys = [c for c in dict.fromkeys([*by, x, *([facet] if facet else []), "kernel", "l2"]) if c in df.columns]
    e, g = (df[df["mode"] == m].groupby(keys, dropna=False)["median_us"].median() for m in ("eager", "graph"))
    d = (e - g).dropna().rename("overhead_us").reset_index()
    d = d[d["overhead_us"] > 0].assign(mode="eager-graph")
    note = "eager time minus graph-replay time per call: Python dispatch and launch, which graph replay removes"
    return lines(d, x, "overhead_us", by, title, ceilings, y_title="eager - graph (us)", facet=facet,
                 spread=False, note=note,
                 hlines={f"one eager launch {eng(ceilings.launch_eager_us * 1e-6, 's')}": ceilings.launch_eager_us})


def roofline(df: pd.DataFrame, ceilings: Ceilings, title: str, color: str = "variant") -> go.Figure:
    """Roofline scatter: achieved FLOP/s against intensity, every roof drawn and labelled.

    Points need the columns :func:`kdtree.bench.roofline.classify` adds. Rows without FLOPs
    (tree kernels) are left out, and so are eager rows on a GPU: eager time includes the Python
    dispatch, which no device roof describes (their latency chart shows them). A variant keeps
    its colour and marker; a warm-L2 point is hollow.
    """
    if "intensity" not in df.columns:
        raise ValueError("roofline: classify() the table first (no 'intensity' column)")
    d = df[(df["flops"] > 0) & df["intensity"].notna()]
    if ceilings.kind == "gpu" and "mode" in d.columns:
        d = d[d["mode"] != "eager"]
    fig = go.Figure()
    peak = np.nanmax([ceilings.tensor_flops, ceilings.fp32_flops])
    ridges = [peak / bw for bw in (ceilings.hbm_bw, ceilings.l2_bw) if math.isfinite(bw) and bw > 0]
    lo, hi = (d["intensity"].min() / 10, d["intensity"].max() * 10) if len(d) else (0.1, 1e4)
    lo, hi = min([lo, *(r / 10 for r in ridges)]), max([hi, *(r * 3 for r in ridges)])   # both knees in view
    grid = np.logspace(math.log10(lo), math.log10(hi), 64)
    for roof, g in roof_lines(ceilings, grid).groupby("roof", sort=False):
        y = g["flops"].to_numpy() / 1e12
        xs = g["intensity"].to_numpy()
        if roof in ("hbm", "l2"):        # sloped part only, labelled a third of the way up it
            bw = ceilings.hbm_bw if roof == "hbm" else ceilings.l2_bw
            text = f"{ROOF_LABELS[roof]} {eng(bw, 'B/s')}"
            ridge = min(xs[-1], y.max() * 1e12 / bw)
            hbm = roof == "hbm"          # the lower of the two: its label below the line, L2's above
            reference_line(fig, text, xs[0], ridge, xs[0] * bw / 1e12, ridge * bw / 1e12, dash=_ROOF_DASH[roof],
                           log_x=True, log_y=True, at=0.35, anchor="left" if hbm else "right", below=hbm)
        else:
            rate = ceilings.tensor_flops if roof == "tensor" else ceilings.fp32_flops
            reference_line(fig, f"{ROOF_LABELS[roof]} {eng(rate, 'FLOP/s')}", xs[0], xs[-1], y[0], y[-1],
                           dash=_ROOF_DASH[roof], log_x=True, log_y=True, anchor="right")
    hover = [c for c in ("kernel", "variant", "q_len", "budget", "batch", "heads", "prefix", "mode", "l2",
                         "median_us", "achieved_tflops", "bound", "fraction", "diagnosis") if c in d.columns]
    ident = color if color in d.columns else "kernel"
    for (name, l2), g in d.groupby([ident, d["l2"] if "l2" in d.columns else pd.Series("n/a", d.index)],
                                   sort=True):
        c, symbol = variant_style(name)
        if str(name) not in {t.name for t in fig.data}:
            _entry(fig, str(name), line=False)
        fig.add_trace(go.Scatter(x=g["intensity"], y=g["achieved_tflops"], mode="markers", name=str(name),
                                 legendgroup=str(name), showlegend=False,
                                 marker={"symbol": _symbol(symbol, L2_OPEN.get(l2, False)), "size": 9, "color": c,
                                         "line": {"width": 1.5, "color": c}},
                                 text=row_text(g, hover, "<br>", named=True), hovertemplate="%{text}<extra></extra>"))
    if "l2" in d.columns and d["l2"].nunique() > 1:
        for state in _sorted(d["l2"].dropna().unique()):
            _key(fig, f"{state} L2{' (hollow)' if L2_OPEN.get(state) else ''}",
                 marker={"symbol": _symbol("circle", L2_OPEN.get(state, False))})
    fig.update_xaxes(title="intensity (FLOP per byte, minimum bytes)", type="log")
    fig.update_yaxes(title="TFLOP/s", type="log")
    modes = _states(d, "mode")
    note = (f"which roof binds each point: FLOP/s against intensity ({modes} timing"
            + ("; eager points are judged against their host floor, see the latency charts)" if ceilings.kind == "gpu"
               else ")"))
    return label(fig, title, ceilings, d, note)


def ceilings_bars(ceilings: Ceilings) -> go.Figure:
    """Measured ceilings against the datasheet (where known), one bar pair per ceiling."""
    t = ceilings.table()
    t = t[~t["ceiling"].str.contains(":")]          # the headline ceilings; probes are in the table
    fig = go.Figure([go.Bar(x=t["ceiling"] + " (" + t["unit"] + ")", y=t["value"], name="measured",
                            marker_color=BLUE, text=[f"{v:.3g}" for v in t["value"]], textposition="outside")])
    if t["datasheet"].notna().any():
        fig.add_trace(go.Bar(x=t["ceiling"] + " (" + t["unit"] + ")", y=t["datasheet"], name="datasheet (label only)",
                             marker_color=ORANGE))
    fig.update_yaxes(type="log", title="value (unit on each bar)")
    return label(fig, "Measured device ceilings", ceilings,
                 note="the roofs every other chart of the run is drawn on, beside the datasheet")


# The engine's step phases in step order, with what each is.
PHASES = {"draft": "draft (drafter forward)", "topk": "top-K of the draft", "build": "tree build",
          "verify": "verify (target forward)", "verify.attention": "  of which attention",
          "verify.rest": "  of which the rest", "accept": "accept", "compact": "KV compaction",
          "commit": "commit", "step": "whole step (device)", "host": "host time to issue the step"}


def breakdown_table(breakdown: pd.DataFrame):
    """The engine's step breakdown for reading: one row per phase in step order, one column per
    decode mode, budget and timing mode, named in words; cells are median times per step."""
    need = {"phase", "mode", "decode", "budget", "median_us"}
    if not need <= set(breakdown.columns):
        raise ValueError(f"breakdown_table: the table lacks {sorted(need - set(breakdown.columns))}")
    d = breakdown.assign(column=[("greedy" if dec == "ar" else f"{dec} b={int(b)}") + f" · {m}"
                                 for dec, b, m in zip(breakdown["decode"], breakdown["budget"], breakdown["mode"])])
    order = list(dict.fromkeys(d.sort_values(["decode", "budget", "mode"])["column"]))
    p = d.pivot_table(index="phase", columns="column", values="median_us", aggfunc="median")[order]
    phases = [ph for ph in PHASES if ph in p.index] + [ph for ph in p.index if ph not in PHASES]
    out = pd.DataFrame({"phase": [PHASES.get(ph, ph) for ph in phases]})
    for c in order:
        out[f"{c} (median time)"] = [eng(v * 1e-6, "s") for v in p.loc[phases, c]]
    return (out.style.hide(axis="index").set_properties(**{"text-align": "left"})
            .set_caption("Median time per step of each phase; b = tree budget; greedy = one token per step"))
