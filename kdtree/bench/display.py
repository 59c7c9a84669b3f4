"""How numbers are shown: one engineering formatter and one table of column labels and units.

Every table of the workbook (notebooks, run summaries, comparisons) and every hover text goes
through :func:`display_table` or :func:`fmt`, so a time reads ``87.8 us`` or ``10.4 ms``, a
rate ``1.83 TB/s`` or ``423 TFLOP/s``, wherever it appears.
"""
from __future__ import annotations

import math

import pandas as pd

_PREFIXES = {-5: "f", -4: "p", -3: "n", -2: "u", -1: "m", 0: "", 1: "k", 2: "M", 3: "G", 4: "T", 5: "P", 6: "E"}

# column -> (header, unit, scale to the unit). Units: "s", "FLOP", "B", "FLOP/s", "B/s", "FLOP/B" go through
# eng(); "%" multiplies by 100; "x" is a factor; "" is a plain number (3 significant digits).
COLUMNS = {
    "median_us": ("median time", "s", 1e-6), "p20_us": ("p20 time", "s", 1e-6), "p80_us": ("p80 time", "s", 1e-6),
    "attainable_us": ("attainable time", "s", 1e-6), "ideal_us": ("ideal time", "s", 1e-6),
    "seconds": ("time", "s", 1.0),
    "flops": ("FLOPs", "FLOP", 1.0), "flops_exec": ("FLOPs as executed", "FLOP", 1.0),
    "bytes_min": ("bytes (minimum)", "B", 1.0), "bytes_moved": ("bytes moved", "B", 1.0),
    "hbm_bytes": ("HBM bytes", "B", 1.0), "dram_bytes": ("DRAM bytes", "B", 1.0), "l2_bytes": ("L2 bytes", "B", 1.0),
    "intensity": ("intensity (FLOP/B)", "FLOP/B", 1.0),
    "intensity_l2": ("L2 intensity (FLOP/B)", "FLOP/B", 1.0),
    "achieved_tflops": ("achieved FLOP/s", "FLOP/s", 1e12), "best_tflops": ("best FLOP/s", "FLOP/s", 1e12),
    "achieved_tbs": ("achieved B/s (minimum bytes)", "B/s", 1e12),
    "best_tbs": ("best B/s (minimum bytes)", "B/s", 1e12),
    "hbm_tbs": ("HBM B/s", "B/s", 1e12), "moved_tbs": ("B/s moved", "B/s", 1e12),
    "fraction": ("fraction of roof (%)", "%", 1.0), "median_fraction": ("median fraction of roof (%)", "%", 1.0),
    "gap_to_ideal": ("gap to ideal (x)", "x", 1.0), "ratio": ("ratio b/a (x)", "x", 1.0),
    "tokens_per_s": ("tokens/s", "", 1.0), "speedup": ("speedup over greedy (x)", "x", 1.0),
    "tau": ("acceptance length (tokens/step)", "", 1.0), "l2": ("L2", "", 1.0), "q_len": ("q_len", "", 1.0),
    # The engine's throughput table: how far a run followed greedy decoding, and its drafter reference.
    "steps": ("decode steps", "", 1.0), "lossless": ("output equals greedy", "", 1.0),
    "agree_ar": ("tokens equal to greedy (%)", "%", 1.0),
    "first_divergence": ("first token index parting from greedy (-1: none)", "", 1.0),
    "reference_rounds": ("drafter reference rounds", "", 1.0),
    "self_consistent": ("drafter reference settled", "", 1.0), "accuracy": ("drafter top-1 accuracy", "", 1.0),
    "cuda_graph": ("CUDA graph", "", 1.0),
}
ENG_UNITS = ("s", "FLOP", "B", "FLOP/s", "B/s", "FLOP/B")


def eng(value, unit: str = "") -> str:
    """``value`` (in base units) in engineering notation with 3 significant digits.

    >>> eng(87.8e-6, "s"), eng(1.0412e-2, "s"), eng(1.83e12, "B/s"), eng(4.23e14, "FLOP/s")
    ('87.8 us', '10.4 ms', '1.83 TB/s', '423 TFLOP/s')

    NaN and None give ``""``; zero gives ``0 <unit>``.
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    v = float(value)
    if v == 0 or not math.isfinite(v):
        return f"{v:g} {unit}".strip()
    exp = max(min(math.floor(math.log10(abs(v)) / 3), max(_PREFIXES)), min(_PREFIXES))
    scaled = v / 10 ** (3 * exp)
    if abs(float(f"{scaled:.3g}")) >= 1000 and exp < max(_PREFIXES):    # 999.96 rounds up to the next prefix
        exp, scaled = exp + 1, scaled / 1000
    return f"{scaled:.3g} {_PREFIXES[exp]}{unit}".strip()


def fmt(value, unit: str = "", scale: float = 1.0) -> str:
    """One cell: engineering notation for :data:`ENG_UNITS`, ``12%``, ``1.57x``, integers as
    integers, other numbers to 3 significant digits (``3,719`` from a thousand up), text as is;
    missing values give ``""``."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    v = float(value) * scale
    if unit in ENG_UNITS:
        return eng(v, unit)
    if unit == "%":
        return f"{100 * v:.3g}%"
    if unit == "x":
        return f"{v:.3g}x"
    if v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return f"{v:,.0f}" if 1e3 <= abs(v) < 1e15 else f"{v:.3g}"


def header(column: str) -> str:
    """The display header of ``column`` (its label names the quantity and unit)."""
    return COLUMNS.get(column, (column,))[0]


def display_table(df: pd.DataFrame, columns: list[str] | None = None) -> pd.DataFrame:
    """``df`` as strings for reading: chosen columns (those present), every cell formatted by
    :func:`fmt` with its column's unit, headers from :data:`COLUMNS`, and no all-empty column."""
    d = df if columns is None else df[[c for c in columns if c in df.columns]]
    d = d.loc[:, [c for c in d.columns if d[c].notna().any() and not d[c].astype(str).eq("").all()]]
    out = pd.DataFrame(index=d.index)
    for c in d.columns:
        _, unit, scale = COLUMNS.get(c, (c, "", 1.0))
        out[header(c)] = [fmt(v, unit, scale) for v in d[c]]
    return out.reset_index(drop=True)
