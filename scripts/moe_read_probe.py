"""Is the MoE grouped GEMM's weight stream held by its read pattern? (GPU host)

    python scripts/moe_read_probe.py [OUT.csv]

At one token the routed gate/up GEMM streams one expert's [4096, 7168] bf16 weights (58.7 MB)
at 3.5-3.7 TB/s and the down GEMM its [7168, 2048] (29.4 MB) in about 8 us, against 4.6 TB/s
for the read probe (docs/perf_log.md, session 14). Each block reads its 32 rows (14 KB apart)
512 bytes of every row at a time. ``rows_probe`` (cuda/probes.cu) reads the same bytes in that
pattern and, as a control, as one contiguous range per block (what a weight layout packed in the
GEMM's read order would give), at 32, 16 and 8 rows a block; ``read_probe`` (the ceilings'
HBM read probe, a grid-stride stream over 8 blocks an SM) reads the same matrix. Each call reads
the next of several experts' matrices (more than 2.5x the L2 in all; cold L2 as in the layer);
the configurations' graph replays alternate (median, p20-p80). No math, so the times are the
read pattern's alone.
"""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import torch

from kdtree.bench.timing import time_graphs
from kdtree.kernels import get_kernel, launch, ptr

SHAPES = {"gate_up": (4096, 7168), "down": (7168, 2048)}   # one expert's rows x K (bf16), Kimi K2


def read_rows(m: torch.Tensor, rows_per_block: int, contiguous: bool, sink: torch.Tensor, all_: bool = False) -> None:
    """``rows_probe`` over the 2-D matrix ``m`` (any 2-byte dtype, rows a multiple of
    ``rows_per_block``, each row a multiple of 512 bytes): ``rows_per_block`` rows a block, in the
    GEMM's pattern or ``contiguous``; ``all_``: each thread's XOR into ``sink`` [blocks, 128]."""
    rows, k = m.shape
    launch(get_kernel("probes", "rows_probe"), (rows // rows_per_block,), (128,),
           (ptr(m), np.int32(k * 2 // 16), np.int32(rows_per_block), np.int32(contiguous), np.int32(all_),
            np.uint32(1), ptr(sink)))


def configs(name: str, rows: int, sms: int, mats: torch.Tensor):
    """(label, blocks, call) for each pattern at ``mats``' [rows, k]: the calls rotate over its experts."""
    sink, stream = torch.zeros(1, dtype=torch.int32, device="cuda"), get_kernel("probes", "read_probe")
    out = []
    for rpb in (32, 16, 8):
        for contiguous in (False, True):
            def call(rpb=rpb, contiguous=contiguous, it=iter(range(1 << 30))):
                read_rows(mats[next(it) % len(mats)], rpb, contiguous, sink)
            out.append((f"{name} {'contiguous' if contiguous else 'rows'} {rpb} rows/block", rows // rpb, call))

    def grid_stride(it=iter(range(1 << 30))):
        m = mats[next(it) % len(mats)]
        launch(stream, (8 * sms,), (256,), (ptr(m), np.int64(m.numel() // 8), np.int32(1), np.float32(-1.0),
                                            ptr(sink)))
    out.append((f"{name} read_probe (grid-stride)", 8 * sms, grid_stride))
    return out


def main(out_csv: str | None = None) -> None:
    props = torch.cuda.get_device_properties(0)
    rows_out = []
    for name, (rows, k) in SHAPES.items():
        nbytes = rows * k * 2
        n_experts = max(2, -(-int(2.5 * props.L2_cache_size) // nbytes))
        mats = torch.randint(-2 ** 15, 2 ** 15, (n_experts, rows, k), dtype=torch.int16, device="cuda")
        cfg = configs(name, rows, props.multi_processor_count, mats)
        times = time_graphs([c for _, _, c in cfg], reps=30, calls_per_graph=2 * n_experts, warmup=2, l2="cold")
        ref = times[-1].median_us
        for (label, blocks, _), t in zip(cfg, times):
            rows_out.append(dict(config=label, blocks=blocks, mb=nbytes / 1e6, us=t.median_us, p20=t.p20_us,
                                 p80=t.p80_us, tbps=nbytes / t.median_us / 1e6, of_read_probe=ref / t.median_us,
                                 sm_clock_mhz=t.sm_clock_mhz))
        del mats
        torch.cuda.empty_cache()
    print(f"{props.name}: one expert's matrix read, cold L2, graph replay (median, p20-p80)")
    print(f"{'config':42s} {'blocks':>6s} {'MB':>6s} {'us':>7s} {'p20-p80':>13s} {'TB/s':>5s} {'of probe':>8s}")
    for r in rows_out:
        print(f"{r['config']:42s} {r['blocks']:6d} {r['mb']:6.1f} {r['us']:7.2f} {r['p20']:6.2f}-{r['p80']:6.2f} "
              f"{r['tbps']:5.2f} {r['of_read_probe']:8.2f}")
    if out_csv:
        pd.DataFrame(rows_out).to_csv(out_csv, index=False)


if __name__ == "__main__":
    if len(sys.argv) > 2:
        sys.exit(__doc__)
    main(*sys.argv[1:])
