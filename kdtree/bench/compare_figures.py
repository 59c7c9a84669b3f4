"""The figures of a comparison page, legible at any number of points.

Two runs of the default sweep share over a thousand points; one labelled row per point would
make a chart tens of thousands of pixels tall. So the page has two charts of bounded height:

* :func:`family_strip`: every compared point as a marker on one row per noise family
  (notebook, kernel or table, timing mode), with the family's noise band, its shift where
  one is reported, and the no-change line; hover names the point. Height grows with the
  number of families, not of points.
* :func:`flagged_chart`: the flagged points, one labelled row each, largest change first,
  then the largest unflagged changes up to :data:`MIN_ROWS` rows; at most :data:`TOP` rows,
  and the title says how many were left out.

Both plot the slowdown of run b against run a (b/a for times, a/b for rates: above 1 is
slower), on a log axis.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kdtree.bench import compare, plots

TOP = 40            # at most this many labelled rows in the flagged chart
MIN_ROWS = 15       # the flagged chart shows at least this many rows (the largest changes) where it can
ROW_PX = 18         # height of one labelled row
FAMILY_PX = 46      # height of one family's row in the strip
_FLAG_STYLE = {"slower": (plots.VERMILLION, "triangle-right"), "faster": (plots.BLUE, "triangle-left"),
               "": ("#999999", "circle"), "n/a": ("#999999", "circle-open")}
_FLAG_NAME = {"": "within noise", "n/a": "not comparable"}


def slowdown(t: pd.DataFrame) -> pd.Series:
    """The slowdown of each row of a :func:`kdtree.bench.compare.compare_table` result: the
    ratio b/a for times, a/b for rates (above 1: run b is slower)."""
    higher = t["metric"].map(lambda m: compare.METRICS[m][2]).astype(bool)
    return t["ratio"].where(~higher, 1 / t["ratio"])


def labels(t: pd.DataFrame) -> pd.Series:
    """:func:`kdtree.bench.compare.point_label` of each row, repeats numbered apart."""
    label = compare.point_label(t)
    return label + label.groupby(label).cumcount().map(lambda i: f" ({i + 1})" if i else "")


def _hover(d: pd.DataFrame) -> list[str]:
    return [f"{lab}<br>{compare.value_text(m, va)} -> {compare.value_text(m, vb)} (ratio {r:.3g})"
            for lab, m, va, vb, r in zip(d["label"], d["metric"], d["a"], d["b"], d["ratio"])]


def _points(t: pd.DataFrame) -> pd.DataFrame:
    d = t[t["ratio"].notna() & np.isfinite(t["ratio"]) & (t["ratio"] > 0)]
    return d.assign(slowdown=slowdown(d).to_numpy(), label=labels(d).to_numpy())


def _layout(fig: go.Figure, title: str, subtitle: str, height: int, ida: str, idb: str) -> None:
    fig.update_xaxes(type="log", side="top",
                     title=f"slowdown of {idb} against {ida} (times b/a, rates a/b; above 1: slower)")
    fig.update_layout(template="plotly_white", height=height, margin={"t": 150, "l": 10, "r": 10},
                      title={"text": f"{title}<br><sup>{subtitle}</sup>", "x": 0.01},
                      legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1, "yanchor": "top",
                              "xref": "container", "yref": "container"})


def _no_change(fig: go.Figure, y0, y1, at) -> None:
    """The labelled no-change line at slowdown 1 from y0 to y1, its label at y ``at``."""
    fig.add_trace(go.Scatter(x=[1, 1], y=[y0, y1], mode="lines", showlegend=False, hoverinfo="skip",
                             meta={"reference": "no change"}, line={"color": plots.REFERENCE_COLOR, "dash": "longdash"}))
    fig.add_annotation(x=0, y=at, xref="x", yref="y", text="no change", showarrow=False, yanchor="bottom",
                       xanchor="left", font={"size": 11, "color": plots.REFERENCE_COLOR})


def family_strip(t: pd.DataFrame, ida: str, idb: str) -> go.Figure:
    """Every compared point on one row per noise family (markers spread vertically within the
    row, coloured by flag, named on hover), the family's noise band (a grey bar: a point
    must leave it to be flagged), its shift where one is reported (a black tick), and the
    no-change line. Height: :data:`FAMILY_PX` per family."""
    d = _points(t)
    fams = list(dict.fromkeys(sorted(d["family"])))
    row = {f: i for i, f in enumerate(fams)}
    # Spread each family's points over its row, deterministically, so that none hides another.
    rank = d.groupby("family").cumcount()
    size = d.groupby("family")["family"].transform("size")
    y = d["family"].map(row) + np.where(size > 1, (rank / (size - 1).clip(lower=1) - 0.5) * 0.6, 0.0)
    d = d.assign(y=y.to_numpy())
    fig = go.Figure()
    noise = compare.family_table(t).set_index(["metric", "family"])
    bx, by, sx, sy = [], [], [], []
    for (metric, fam), r in noise.iterrows():
        if fam not in row:
            continue
        higher = compare.METRICS[metric][2]
        centre = (1 / r["shift"] if higher else r["shift"]) if r["shift reported"] else 1.0
        bx += [centre / r["band"], centre * r["band"], None]
        by += [row[fam], row[fam], None]
        if r["shift reported"]:
            sx.append(centre)
            sy.append(row[fam])
    fig.add_trace(go.Scatter(x=bx, y=by, mode="lines", name="noise band of the family", hoverinfo="skip",
                             line={"color": "#cccccc", "width": 12}))
    if sx:
        fig.add_trace(go.Scatter(x=sx, y=sy, mode="markers", name="shift of the whole family",
                                 marker={"symbol": "line-ns-open", "size": 30, "color": "black", "line": {"width": 2}},
                                 hovertemplate="shift of the whole family: %{x:.3g}x<extra></extra>"))
    for flag in ("", "n/a", "faster", "slower"):
        g = d[d["flag"] == flag]
        if len(g):
            color, symbol = _FLAG_STYLE[flag]
            fig.add_trace(go.Scatter(x=g["slowdown"], y=g["y"], mode="markers", name=_FLAG_NAME.get(flag, flag),
                                     marker={"color": color, "symbol": symbol, "size": 7 if flag in ("", "n/a") else 10},
                                     text=_hover(g), hovertemplate="%{text}<extra></extra>"))
    if fams:
        _no_change(fig, -0.5, len(fams) - 0.5, len(fams) - 0.5)
    fig.update_yaxes(tickmode="array", tickvals=list(range(len(fams))), ticktext=fams, range=[len(fams) - 0.5, -0.5],
                     automargin=True, showgrid=False, zeroline=False)
    s = compare.summary(t)
    _layout(fig, "Every compared point, by noise family",
            f"{s['compared']} points in {len(fams)} families; grey bar: the family's noise band "
            f"(past {compare.MIN_CHANGE:.0%} and {compare.Z:g} sigma of its between-run scatter); black tick: "
            "the family's shift where the whole family moved; hover a point for its name",
            200 + FAMILY_PX * max(len(fams), 2), ida, idb)
    return fig


def flagged_chart(t: pd.DataFrame, ida: str, idb: str, top: int = TOP) -> go.Figure:
    """The flagged points, one row each labelled by point, largest change first, then the
    largest unflagged changes up to :data:`MIN_ROWS` rows; at most ``top`` rows (the title
    says how many flagged points were left out). Height: :data:`ROW_PX` per row."""
    d = _points(t)
    d = d.assign(_size=np.abs(np.log(d["slowdown"])))
    flagged = d[d["flag"].isin(["slower", "faster"])].sort_values("_size", ascending=False)
    rest = d[~d.index.isin(flagged.index)].sort_values("_size", ascending=False)
    shown = pd.concat([flagged.head(top), rest.head(max(0, min(top, MIN_ROWS) - len(flagged)))])
    shown = shown.sort_values("slowdown")
    fig = go.Figure()
    for flag in ("", "n/a", "faster", "slower"):
        g = shown[shown["flag"] == flag]
        if len(g):
            color, symbol = _FLAG_STYLE[flag]
            fig.add_trace(go.Scatter(x=g["slowdown"], y=g["label"], mode="markers", name=_FLAG_NAME.get(flag, flag),
                                     marker={"color": color, "symbol": symbol, "size": 9},
                                     text=_hover(g), hovertemplate="%{text}<extra></extra>"))
    if len(shown):
        _no_change(fig, shown["label"].iat[0], shown["label"].iat[-1], shown["label"].iat[-1])
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=list(shown["label"]), automargin=True,
                     tickfont={"size": 10}, dtick=1, range=[-0.5, len(shown) - 0.5])
    left = len(flagged) - min(len(flagged), top)
    what = (f"the {top} largest of {len(flagged)} flagged points ({left} more in the table below)" if left else
            f"{len(flagged)} flagged point{'s' if len(flagged) != 1 else ''}"
            + (", then the largest changes within the noise" if len(shown) > len(flagged) else ""))
    _layout(fig, "What changed, point by point", f"{what}; sorted by slowdown", 240 + ROW_PX * max(len(shown), 4),
            ida, idb)
    return fig
