"""What a verify-attention call should take before it runs (``kdtree plan``).

For a shape (B, N, H, P) and each variant: the launch plan ``kdtree.attention.launch_plan``
picks (kernel, layout, KV splits, a head/tail launch's head row tiles and tail splits), the cost
model's FLOPs and bytes (``kdtree.bench.models``), and the time each roof of a measured device
allows (``kdtree.bench.roofline.roof_times``): the binding one is the floor no kernel of that
plan can beat. The roofs are a device's measured ceilings (a run's ``ceilings.json``), never its
datasheet. Needs no GPU: it is the workbook's diagnosis made before the measurement, e.g. for
the shard shapes of a tensor-parallel deployment one has not got a machine for yet.
"""
from __future__ import annotations

import math

import pandas as pd

from kdtree.bench.ceilings import Ceilings
from kdtree.bench.models import H200_SMS, verify_attention_cost
from kdtree.bench.roofline import ROOF_LABELS, ideal_time, roof_times

VARIANTS = ("fused", "cascade", "naive")
ROOFS = ("launch", "hbm", "l2", "tensor", "waves")


def plan_table(ceilings: Ceilings, *, batch: int, nodes: int, heads: int, prefix: int,
               variants: tuple[str, ...] = VARIANTS, l2: str = "cold", num_sms: int = H200_SMS) -> pd.DataFrame:
    """The launch plan, FLOPs, bytes and roof times of one verify-attention call per variant.

    Parameters
    ----------
    ceilings : Ceilings
        Measured roofs of the device (``Ceilings.load`` of a run's ``ceilings.json``); a CPU
        host's set is refused, its numbers are no GPU roofline.
    batch, nodes, heads, prefix : int
        B, N (tree nodes = budget + 1 = q_len), H (heads on this GPU) and P (prefix length).
    variants : tuple of str
        Any of :data:`VARIANTS`.
    l2 : {"cold", "warm"}
        L2 state: warm lets inputs that fit the L2 skip the HBM roof.
    num_sms : int
        Streaming multiprocessors (132 on an H100 or H200 SXM).

    Returns
    -------
    pandas.DataFrame
        One row per variant: the shape (``batch``, ``nodes``, ``heads``, ``prefix``), ``variant``,
        ``impl``, ``layout``, ``splits``, ``head``, ``tail_splits``,
        ``launches``, ``gflop`` (useful), ``hbm_mb`` (the model's HBM bytes), ``<roof>_us`` for
        each of :data:`ROOFS` that applies (NaN where not), ``bound`` (the binding roof),
        ``floor_us`` (its time), ``floor_tflops`` (useful FLOPs at that time) and ``ideal_us``
        (the best any variant could do: the FLOPs at the tensor rate, the minimum bytes from HBM,
        one launch).
    """
    if ceilings.kind != "gpu":
        raise ValueError(f"ceilings: {ceilings.device} is a CPU host's set, not a GPU roofline; "
                         "use the ceilings.json of a run on the GPU to plan for")
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise ValueError(f"variants: expected some of {', '.join(VARIANTS)}, got {', '.join(variants) or 'none'}")
    if l2 not in ("cold", "warm"):
        raise ValueError(f"l2: expected 'cold' or 'warm', got {l2!r}")
    for name, value, low in (("batch", batch, 1), ("nodes", nodes, 1), ("heads", heads, 1), ("prefix", prefix, 0),
                             ("num_sms", num_sms, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
    from kdtree.attention import launch_plan

    rows = []
    for variant in variants:
        plan = launch_plan(variant, batch=batch, nodes=nodes, heads=heads, kv_rows=prefix + nodes, num_sms=num_sms)
        cost = verify_attention_cost(variant, batch=batch, nodes=nodes, heads=heads, prefix=prefix, num_sms=num_sms,
                                     **({} if ceilings.l2_bytes is None else {"l2_bytes": ceilings.l2_bytes}))
        times = roof_times(cost, ceilings, "graph", l2)
        bound = max(times, key=times.get)
        rows.append({"batch": batch, "nodes": nodes, "heads": heads, "prefix": prefix, "variant": variant,
                     "impl": plan.impl, "layout": plan.layout, "splits": plan.splits,
                     "head": plan.head, "tail_splits": plan.tail_splits, "launches": cost.launches,
                     "gflop": cost.flops / 1e9, "hbm_mb": cost.hbm_bytes / 1e6,
                     **{f"{r}_us": times.get(r, math.nan) for r in ROOFS},
                     "bound": bound, "floor_us": times[bound], "floor_tflops": cost.flops / times[bound] / 1e6,
                     "ideal_us": ideal_time(cost, ceilings, "graph")[0]})
    return pd.DataFrame(rows)


def render(table: pd.DataFrame, ceilings: Ceilings, source: str, l2: str = "cold") -> str:
    """Rows of ``plan_table`` (of one shape or several, with ``batch``, ``nodes``, ``heads`` and
    ``prefix`` columns) as the text ``kdtree plan`` prints: the device line, then one line per
    shape and variant (plan, launches, GFLOP, HBM MB, the roofs' times, the binding roof)."""
    head = [f"CUDA-graph replay, {l2} L2; roofs measured on {ceilings.device} ({source}): HBM "
            f"{ceilings.hbm_bw / 1e12:.2f} TB/s, L2 {ceilings.l2_bw / 1e12:.2f} TB/s, bf16 "
            f"{ceilings.tensor_flops / 1e12:.0f} TFLOP/s, graph launch {ceilings.launch_graph_us:.1f} us"]
    cols = ["B", "N", "H", "P", "variant", "plan", "launches", "GFLOP", "HBM MB", *[f"{ROOF_LABELS[r]} us" for r in ROOFS],
            "bound", "floor us", "TFLOP/s at floor", "ideal us"]
    lines = []
    for r in table.itertuples():
        plan = f"{r.impl} {r.layout} {r.splits} split{'s' if r.splits > 1 else ''}".replace("  ", " ")
        if r.head:
            plan += f", head {r.head} row tiles, tail {r.tail_splits} splits"
        lines.append([str(r.batch), str(r.nodes), str(r.heads), str(r.prefix), r.variant, plan, str(r.launches),
                      f"{r.gflop:.2f}", f"{r.hbm_mb:.1f}",
                      *["-" if math.isnan(getattr(r, f"{x}_us")) else f"{getattr(r, f'{x}_us'):.1f}" for x in ROOFS],
                      ROOF_LABELS[r.bound], f"{r.floor_us:.1f}", f"{r.floor_tflops:.0f}", f"{r.ideal_us:.1f}"])
    widths = [max(len(c), *(len(ln[i]) for ln in lines)) for i, c in enumerate(cols)]
    fmt = "  ".join(f"{{:{'<' if c in ('variant', 'plan') else '>'}{w}}}" for c, w in zip(cols, widths))
    return "\n".join(head + ["", fmt.format(*cols)] + [fmt.format(*ln) for ln in lines])
