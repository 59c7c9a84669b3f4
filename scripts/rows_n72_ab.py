"""rn72 (72 rows on wgmma's N) against pair and tma_seq at the tensor-parallel shard shapes (GPU host, dev).

At each (B, N, H, P): fresh inputs (``attention_dev.input_sets``: cold L2), the kernels checked
against float64 on the first and last sequence, then timed by CUDA-graph replay with their replays
alternating (``attention_dev.time_configs``). Prints one line a shape; with a path, writes the rows
measured so far as ``attention_dev.py``'s CSV after each shape (``perf_tables.py attention-dev CSV
fused_pair``).

    python scripts/rows_n72_ab.py [OUT_CSV [B,N,H,P ...]]

(default shapes: ``SHAPES``)
"""
import sys

import torch

from attention_dev import ceilings, check_config, cost, input_sets, references, run_config, time_configs, write_rows
from kdtree.attention import D_V, _num_sms, launch_plan

SHAPES = [(64, 9, 8, 16384), (8, 9, 8, 16384), (64, 9, 8, 4096), (8, 9, 8, 32768), (64, 9, 8, 32768),
          (1, 9, 8, 16384), (8, 17, 8, 16384), (8, 9, 16, 16384), (8, 9, 32, 16384), (64, 17, 8, 4096)]
CONFIGS = [("fused", "pair"), ("fused", "tma_seq"), ("fused", "rn72")]


def main(path=None, *shapes) -> int:
    dev = torch.device("cuda")
    sms, l2 = _num_sms(0), torch.cuda.get_device_properties(0).L2_cache_size
    bw, rate, _ = ceilings()
    print(f"{torch.cuda.get_device_name(0)}: HBM {bw / 1e12:.2f} TB/s, bf16 {rate / 1e12:.0f} TFLOP/s", flush=True)
    gen = torch.Generator().manual_seed(12)
    rows, ok = [], True
    for B, N, H, P in [tuple(int(v) for v in s.split(",")) for s in shapes] or SHAPES:
        tree, pl, sets = input_sets(B, N, H, P, gen, l2)
        out = (torch.empty(B, N, H, D_V, dtype=torch.bfloat16, device=dev),
               torch.empty(B, N, H, dtype=torch.float32, device=dev))
        flops, nbytes = cost(B, N, H, P, tree)
        refs = references(tree, pl, *sets[0])
        wrong = []
        for variant, impl in CONFIGS:
            out[0].fill_(float("nan"))
            run_config(variant, tree, pl, *sets[0], out, None, impl, None)
            wrong += [f"{impl}: {w}" for w in check_config(refs, out)[1:] if w]
        if wrong:
            print(f"B={B} N={N} H={H} P={P}: {'; '.join(wrong)}", flush=True)
            ok = False
            continue
        line = f"B={B:3d} N={N:3d} H={H:3d} P={P:6d}"
        times = time_configs(CONFIGS, tree, pl, sets, out)
        for (variant, impl), t in zip(CONFIGS, times):
            plan = launch_plan(variant, batch=B, nodes=N, heads=H, kv_rows=P + N, num_sms=sms, impl=impl)
            s = t.median_us * 1e-6
            rows.append(dict(B=B, N=N, H=H, P=P, config=f"fused_{impl}", layout=plan.layout, tile_rows=plan.tile_rows,
                             splits=plan.splits, us=t.median_us, p20=t.p20_us, p80=t.p80_us,
                             frac_bf16=flops / s / rate, frac_hbm=nbytes / s / bw, sm_mhz=t.sm_clock_mhz))
            line += (f" | {impl} {plan.tile_rows}x{plan.splits}: {t.median_us:8.1f} us [{t.p20_us:.1f}, {t.p80_us:.1f}]"
                     f" HBM {nbytes / s / bw:.2f} bf16 {flops / s / rate:.2f}")
        print(line + f" | rn72 / pair {times[2].median_us / times[0].median_us:.3f}"
              f" | rn72 / tma_seq {times[2].median_us / times[1].median_us:.3f}", flush=True)
        if path:  # after every shape: a run its call's time limit cuts keeps what it measured
            write_rows(path, rows)
        sets.clear()
        torch.cuda.empty_cache()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
