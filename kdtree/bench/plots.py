"""Figures of the workbook (plotly), each labelled with device, ceilings, L2 state and timing mode.

``show(fig)`` is the explicit renderer every notebook uses: it emits plotly's own mime type
(JupyterLab draws it) next to a ``text/html`` div whose script calls the global ``Plotly``.
nbconvert keeps the HTML, and the report pages load one local ``plotly.min.js`` in their head,
so the plots draw offline. (plotly's default notebook renderer wraps its call in require.js,
which nbconvert's output never configures: the plots come out blank.)
"""
from __future__ import annotations

import uuid

import pandas as pd
import plotly.graph_objects as go

from kdtree.bench.ceilings import Ceilings
from kdtree.bench.roofline import ROOF_LABELS, roof_lines

_ROOF_STYLE = {"hbm": "dash", "l2": "dot", "tensor": "solid", "fp32": "dashdot"}


def _states(df: pd.DataFrame, col: str) -> str:
    if col not in df.columns or df.empty:
        return "n/a"
    return "+".join(sorted(str(v) for v in df[col].dropna().unique())) or "n/a"


def caption(ceilings: Ceilings, df: pd.DataFrame | None = None) -> str:
    """Subtitle naming the device and ceilings plus the L2 state(s) and timing mode(s) of ``df``."""
    states = "" if df is None else f" | L2: {_states(df, 'l2')} | timing: {_states(df, 'mode')}"
    return ceilings.caption() + states


def label(fig: go.Figure, title: str, ceilings: Ceilings, df: pd.DataFrame | None = None) -> go.Figure:
    """Put ``title`` and the caption (device, ceilings, L2 state, timing mode) on ``fig``."""
    fig.update_layout(title={"text": f"{title}<br><sup>{caption(ceilings, df)}</sup>", "x": 0.01},
                      margin={"t": 90}, template="plotly_white")
    fig.layout.meta = {"kdtree_caption": caption(ceilings, df)}
    return fig


def show(fig: go.Figure) -> None:
    """Display ``fig`` so that JupyterLab and the offline HTML reports both draw it."""
    from IPython.display import display

    div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"kdtree-{uuid.uuid4().hex[:12]}",
                      config={"displaylogo": False, "responsive": True})
    display({"application/vnd.plotly.v1+json": fig.to_plotly_json(), "text/html": div,
             "text/plain": f"<figure: {fig.layout.title.text or ''}>"}, raw=True)


def table(df: pd.DataFrame, columns: list[str] | None = None):
    """A table for notebooks: chosen columns, 3 significant digits, text never truncated."""
    d = df if columns is None else df[[c for c in columns if c in df.columns]]
    floats = [c for c in d.columns if pd.api.types.is_float_dtype(d[c])]
    return (d.style.hide(axis="index").format("{:.3g}", subset=floats, na_rep="")
            .set_properties(**{"text-align": "left", "white-space": "normal"}))


def _fmt(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def row_text(df: pd.DataFrame, cols: list[str], sep: str = " ", named: bool = False) -> pd.Series:
    """One string per row from ``cols`` (missing values left out), for legends and hover text."""
    return df[cols].apply(lambda r: sep.join(f"{k}={_fmt(v)}" if named else _fmt(v)
                                             for k, v in r.items() if not pd.isna(v)), axis=1)


def _series_name(df: pd.DataFrame, by: list[str]) -> pd.Series:
    return row_text(df, by)


def _sorted(values) -> list:
    try:
        return sorted(values)
    except TypeError:    # mixed types
        return sorted(values, key=str)


def lines(df: pd.DataFrame, x: str, y: str, by: list[str], title: str, ceilings: Ceilings, *,
          y_title: str, facet: str | None = None, log_x: bool = True, log_y: bool = True,
          spread: bool = True, hlines: dict[str, float] | None = None) -> go.Figure:
    """One line per combination of ``by`` columns, with p20-p80 error bars for time columns.

    Parameters
    ----------
    df : DataFrame
        Tidy results; ``x``, ``y``, the ``by`` columns and ``facet`` must exist.
    facet : str, optional
        One panel per value of this column (shared y axis; one legend entry per series).
    hlines : dict, optional
        Horizontal reference lines (name -> value), e.g. a bandwidth ceiling, in every panel.
    """
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    missing = [c for c in [x, y, *by, *([facet] if facet else [])] if c not in df.columns]
    if missing:
        raise ValueError(f"lines: columns {missing} not in the table ({list(df.columns)})")
    d = df.assign(_series=_series_name(df, by)).sort_values(x)
    panels = _sorted(d[facet].dropna().unique()) if facet else [None]
    fig = make_subplots(rows=1, cols=len(panels), shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=[f"{facet} = {_fmt(p)}" for p in panels] if facet else None)
    palette = qualitative.Plotly + qualitative.D3
    colors = {name: palette[i % len(palette)] for i, name in enumerate(sorted(d["_series"].unique()))}
    xs, shown = d[x].dropna(), set()
    for col, panel in enumerate(panels, start=1):
        part = d if facet is None else d[d[facet] == panel]
        for name, g in part.groupby("_series", sort=True):
            err = None
            if spread and y == "median_us" and {"p20_us", "p80_us"} <= set(g.columns):
                err = {"type": "data", "symmetric": False, "array": g["p80_us"] - g["median_us"],
                       "arrayminus": g["median_us"] - g["p20_us"]}
            fig.add_trace(go.Scatter(x=g[x], y=g[y], mode="lines+markers", name=name, error_y=err,
                                     legendgroup=name, showlegend=name not in shown,
                                     line={"color": colors[name]}), row=1, col=col)
            shown.add(name)
        for name, v in (hlines or {}).items():   # traces, not add_hline: its labels misplace on log axes
            if len(xs) and v == v:
                fig.add_trace(go.Scatter(x=[xs.min(), xs.max()], y=[v, v], mode="lines", name=name,
                                         legendgroup=name, showlegend=col == 1,
                                         line={"dash": "dash", "color": "gray"}), row=1, col=col)
    fig.update_xaxes(title=x, type="log" if log_x else "linear")
    fig.update_yaxes(type="log" if log_y else "linear")
    fig.update_yaxes(title=y_title, row=1, col=1)
    return label(fig, title, ceilings, df)


def varying(df: pd.DataFrame, dims, exclude: str | None = None) -> list[str]:
    """The columns among ``dims`` (other than ``exclude``) that take more than one value in ``df``."""
    return [c for c in dims if c != exclude and c in df.columns and df[c].nunique() > 1]


def latency(df: pd.DataFrame, x: str, by: list[str], title: str, ceilings: Ceilings,
            facet: str | None = None) -> go.Figure:
    """Median latency (p20-p80 bars) against ``x``, one line per ``by`` combination."""
    return lines(df, x, "median_us", by, title, ceilings, y_title="time per call (us)", facet=facet)


def bandwidth(df: pd.DataFrame, x: str, by: list[str], title: str, ceilings: Ceilings,
              facet: str | None = None) -> go.Figure:
    """Achieved bandwidth on the minimum bytes against ``x``, with the HBM and L2 ceilings."""
    return lines(df, x, "achieved_tbs", by, title, ceilings, y_title="TB/s (minimum bytes / time)",
                 facet=facet, spread=False, hlines={"HBM copy (measured)": ceilings.hbm_bw / 1e12,
                                       "L2 copy (measured)": ceilings.l2_bw / 1e12})


def eager_vs_graph(df: pd.DataFrame, x: str, by: list[str], title: str, ceilings: Ceilings,
                   facet: str | None = None) -> go.Figure:
    """Eager launch against graph replay: both latencies, with the measured launch floors."""
    if "mode" not in df.columns:
        raise ValueError("eager_vs_graph: the table needs a 'mode' column")
    d = df[df["mode"].isin(["eager", "graph"])]
    return lines(d, x, "median_us", [*by, "mode"], title, ceilings, y_title="time per call (us)", facet=facet,
                 hlines={"eager launch": ceilings.launch_eager_us, "graph launch": ceilings.launch_graph_us})


def roofline(df: pd.DataFrame, ceilings: Ceilings, title: str, color: str = "variant") -> go.Figure:
    """Roofline scatter: achieved TFLOP/s against intensity (FLOP per byte moved), all roofs drawn.

    Points need the columns :func:`kdtree.bench.roofline.classify` adds; rows without FLOPs
    (tree kernels) are left out.
    """
    if "intensity" not in df.columns:
        raise ValueError("roofline: classify() the table first (no 'intensity' column)")
    d = df[(df["flops"] > 0) & df["intensity"].notna()]
    fig = go.Figure()
    for roof, g in roof_lines(ceilings).groupby("roof", sort=False):
        fig.add_trace(go.Scatter(x=g["intensity"], y=g["flops"] / 1e12, mode="lines",
                                 name=f"{ROOF_LABELS[roof]} roof", line={"dash": _ROOF_STYLE[roof], "color": "gray"}))
    hover = [c for c in ("kernel", "q_len", "budget", "batch", "heads", "prefix", "mode", "l2", "median_us",
                         "bound", "fraction", "diagnosis") if c in d.columns]
    keys = [color if color in d.columns else "kernel"] + [c for c in ("mode", "l2") if c in d.columns]
    symbols = {}
    for name, g in d.groupby(keys, sort=True):
        state = " ".join(map(str, name[1:]))
        symbols.setdefault(state, len(symbols))
        fig.add_trace(go.Scatter(x=g["intensity"], y=g["achieved_tflops"], mode="markers",
                                 name=" ".join(map(str, name)), marker={"symbol": symbols[state], "size": 8},
                                 text=row_text(g, hover, "<br>", named=True), hovertemplate="%{text}<extra></extra>"))
    fig.update_xaxes(title="FLOP per byte moved", type="log")
    fig.update_yaxes(title="TFLOP/s", type="log")
    return label(fig, title, ceilings, d)


def ceilings_bars(ceilings: Ceilings) -> go.Figure:
    """Measured ceilings against the datasheet (where known), one bar pair per ceiling."""
    t = ceilings.table()
    fig = go.Figure([go.Bar(x=t["ceiling"] + " (" + t["unit"] + ")", y=t["value"], name="measured",
                            text=[f"{v:.3g}" for v in t["value"]], textposition="outside")])
    if t["datasheet"].notna().any():
        fig.add_trace(go.Bar(x=t["ceiling"] + " (" + t["unit"] + ")", y=t["datasheet"], name="datasheet (label only)"))
    fig.update_yaxes(type="log", title="value")
    return label(fig, "Measured device ceilings", ceilings)
