"""The fused kernel at split counts past ``choose_splits``'s cap, at shapes that leave SMs idle (GPU host, dev).

At B = 1 a shard's sequence has one or two row tiles, so 32 splits leave half the SMs or more
without a block. At each (B, N, H, P): fresh inputs (``attention_dev.input_sets``: cold L2), each
(kernel, splits) configuration checked against float64 on the first and last sequence, then all
timed by CUDA-graph replay with their replays alternating (``attention_dev.time_configs``).
A configuration is ``impl:splits`` (``auto`` for the kernel ``launch_plan`` picks at that count,
``plan`` for today's plan). One line a configuration; with a path, the rows as ``attention_dev.py``'s
CSV.

    python scripts/splits_wide.py OUT_CSV [B,N,H,P ...] [-- impl:splits ...]
"""
import sys

import torch

from attention_dev import ceilings, check_config, cost, input_sets, references, run_config, time_configs, write_rows
from kdtree.attention import D_V, _num_sms, launch_plan

SHAPES = [(1, 9, 8, 4096), (1, 9, 8, 16384), (1, 9, 8, 32768), (1, 17, 8, 16384), (1, 17, 8, 32768),
          (1, 9, 16, 32768)]
CONFIGS = ["plan", "auto:48", "auto:64", "auto:96", "auto:128", "rn72:64", "rn72:96", "rn72:128"]


def _configs(B, N, H, P, sms, specs):
    """(label, impl or None, splits or None) of ``specs`` at a shape, counts past its KV tiles dropped."""
    tiles = -(-(P + N) // 64)
    out = []
    for spec in specs:
        if spec == "plan":
            out.append(("plan", None, None))
            continue
        impl, s = spec.split(":")
        if int(s) <= tiles:
            out.append((spec, None if impl == "auto" else impl, int(s)))
    return out


def main(path, *args) -> int:
    shapes = [tuple(int(v) for v in a.split(",")) for a in args if "," in a and ":" not in a] or SHAPES
    specs = [a for a in args if ":" in a or a == "plan"] or CONFIGS
    sms, l2 = _num_sms(0), torch.cuda.get_device_properties(0).L2_cache_size
    bw, rate, _ = ceilings()
    print(f"{torch.cuda.get_device_name(0)}: HBM {bw / 1e12:.2f} TB/s, bf16 {rate / 1e12:.0f} TFLOP/s", flush=True)
    gen = torch.Generator().manual_seed(13)
    rows, ok = [], True
    for B, N, H, P in shapes:
        tree, pl, sets = input_sets(B, N, H, P, gen, l2)
        out = (torch.empty(B, N, H, D_V, dtype=torch.bfloat16, device="cuda"),
               torch.empty(B, N, H, dtype=torch.float32, device="cuda"))
        flops, nbytes = cost(B, N, H, P, tree)
        refs = references(tree, pl, *sets[0])
        cfgs = []
        for label, impl, s in _configs(B, N, H, P, sms, specs):
            out[0].fill_(float("nan"))
            run_config("fused", tree, pl, *sets[0], out, s, impl)
            wrong = check_config(refs, out)[1]
            if wrong:
                print(f"B={B} N={N} H={H} P={P} {label}: {wrong}", flush=True)
                ok = False
            else:
                cfgs.append((label, impl, s))
        times = time_configs([("fused", i, s) for _, i, s in cfgs], tree, pl, sets, out)
        base = times[0].median_us
        for (label, impl, s), t in zip(cfgs, times):
            plan = launch_plan("fused", batch=B, nodes=N, heads=H, kv_rows=P + N, num_sms=sms, impl=impl, splits=s)
            sec = t.median_us * 1e-6
            rows.append(dict(B=B, N=N, H=H, P=P, config=label, impl=plan.impl, layout=plan.layout,
                             tile_rows=plan.tile_rows, splits=plan.splits, us=t.median_us, p20=t.p20_us,
                             p80=t.p80_us, frac_bf16=flops / sec / rate, frac_hbm=nbytes / sec / bw,
                             sm_mhz=t.sm_clock_mhz))
            print(f"B={B} N={N:3d} H={H:2d} P={P:6d} {label:9s} {plan.impl:8s} {plan.tile_rows}x{plan.splits:3d}: "
                  f"{t.median_us:7.1f} us [{t.p20_us:.1f}, {t.p80_us:.1f}] HBM {nbytes / sec / bw:.2f} "
                  f"/ first {t.median_us / base:.3f} at {t.sm_clock_mhz:.0f} MHz", flush=True)
        sets.clear()
        torch.cuda.empty_cache()
    if path and rows:
        write_rows(path, rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
