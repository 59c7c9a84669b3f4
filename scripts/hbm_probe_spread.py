"""How much the HBM read ceiling moves between attempts, timed two ways (GPU host).

Each attempt allocates a fresh 2 GiB buffer and times ``read_probe`` over it (a) as the ceilings
did before: eager launches, CUDA events on an idle GPU after an L2 flush, so the launch's host
dispatch falls inside the span; (b) as they do now (``ceilings._device_us``): alone in a CUDA
graph replayed behind a device hold. Prints one line per attempt and the spread (max / min) of
each method; run it in several fresh processes to see the spread between processes too.

    PYTHONPATH=. python scripts/hbm_probe_spread.py [ATTEMPTS] [REPS]
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from kdtree.bench.ceilings import _device_us, _probe_kernel
from kdtree.bench.timing import time_events
from kdtree.kernels import launch, ptr


def main(attempts: int = 10, reps: int = 40) -> None:
    fn = _probe_kernel("read_probe")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sink = torch.zeros(1, device="cuda")
    res = {"eager": [], "graph": []}
    for i in range(attempts):
        buf = torch.empty((2 << 30) // 4, device="cuda").uniform_()
        n = buf.numel() // 4
        run = lambda buf=buf, n=n: launch(fn, (8 * sms,), (256,), (ptr(buf), np.int64(n), np.int32(1),  # noqa: E731
                                                                  np.float32(-1.0), ptr(sink)))
        line = []
        for how in ("eager", "graph"):
            t = (time_events([run], reps=reps, warmup=3, l2="cold") if how == "eager"
                 else _device_us(run, reps=reps, l2="cold"))
            tbps = n * 16 / (t.median_us * 1e-6) / 1e12
            res[how].append(tbps)
            line.append(f"{how} {tbps:.3f} TB/s ({t.median_us:.1f} us [{t.p20_us:.1f}, {t.p80_us:.1f}], "
                        f"{t.sm_clock_mhz:.0f} MHz)")
        print(f"attempt {i}: " + "; ".join(line), flush=True)
        del buf, run
        torch.cuda.empty_cache()
    for how, v in res.items():
        a = np.asarray(v)
        print(f"{how}: median {np.median(a):.3f} TB/s, min {a.min():.3f}, max {a.max():.3f}, "
              f"spread {a.max() / a.min():.3f}x over {a.size} attempts")


if __name__ == "__main__":
    main(*(int(x) for x in sys.argv[1:3]))
