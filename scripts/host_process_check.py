"""Whether host-dispatched timings agree between processes, as a sweep's twin notebooks need:
PROCS fresh Python processes one after another (a sweep runs each notebook in its own kernel),
each timing the eager calls and host paths of ``host_timing_check`` with :class:`Rounds` as the
sweeps take them, twice. (At 9baa3fb it also took them with every round moved to a vCPU at full
speed, ``--methods rounds,fast_cpu``: no better, ``results/host_process_h200``.)

Prints, per timing, the medians of every process, their max / min, and the share of process
pairs within 5% of each other; at the end the same share over all timings over 50 us, and how
often the two passes inside one process agree.

    python scripts/host_process_check.py [PROCS] [--fixed-layout]

``--fixed-layout`` starts every process with address-space randomisation off (``setarch -R``)
and ``PYTHONHASHSEED=0``: if the processes then agree, what differs between them is where their
memory lies, not when they run.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys

import numpy as np


def child() -> None:
    import torch

    from kdtree.bench.timing import Rounds
    from host_timing_check import eager_points, host_points   # this script's folder is on sys.path

    eager, host = eager_points(torch.device("cuda")), host_points()
    out = {}
    for _ in range(2):   # two passes
        r = Rounds()
        ts = {name: r.events(calls, reps=100, warmup=3, l2="cold" if cold else "warm", floor=floor)
              for name, (calls, floor, cold) in eager.items()}
        ts |= {name: r.host(fn, reps=20, warmup=1) for name, fn in host.items()}
        r.run()
        for name, t in ts.items():
            out.setdefault(name, []).append(t.median_us)
    print(json.dumps(out))


def main(procs: int, fixed_layout: bool) -> None:
    runs = []
    cmd = [sys.executable, __file__, "--child"]
    env = os.environ | ({"PYTHONHASHSEED": "0"} if fixed_layout else {})
    for i in range(procs):
        res = subprocess.run((["setarch", "-R"] if fixed_layout else []) + cmd, capture_output=True, text=True,
                             check=True, env=env)
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(f"process {i + 1} of {procs} done", flush=True)
    print("\nper process the mean of its two passes (us), max/min, pairs within 5%")
    across = []
    for name in runs[0]:
        v = np.array([np.mean(r[name]) for r in runs])
        pairs = [abs(a / b - 1) <= 0.05 for a, b in itertools.combinations(v, 2)]
        if v.min() > 50:
            across += pairs
        print(f"  {name:28s} " + " ".join(f"{x:7.1f}" for x in v) + f"   {v.max() / v.min():5.2f}  {np.mean(pairs):6.1%}")
    within = [abs(a / b - 1) <= 0.05 for r in runs for a, b in r.values() if min(a, b) > 50]
    print(f"\nprocess pairs within 5% over timings above 50 us: {np.mean(across):.1%} of {len(across)}; "
          f"the two passes of one process: {np.mean(within):.1%} of {len(within)}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("procs", type=int, nargs="?", default=6)
    ap.add_argument("--fixed-layout", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child()
    else:
        main(a.procs, a.fixed_layout)
