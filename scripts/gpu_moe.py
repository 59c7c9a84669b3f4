"""The MoE checks and measurements of one device call: GPU tests, the 05 notebook, the kernel sweep.

Usage (from the repository root, after ``source scripts/device_env.sh``; ``.whl`` carried):
    OUT=DIR KDTREE_GIT_SHA=... KDTREE_GIT_DIRTY=0 python3 scripts/gpu_moe.py [steps]

Every file lands directly in DIR (a device call returns what is there even when it is cut off):
gpu_tests.log, ceilings.json, 05.ipynb with its table (05.csv, .parquet, .meta.json), dev.log.
Each step runs in a subprocess under its share of ``DEADLINE`` seconds (env, default 170) from
the start, so a slow step cannot take the call's limit with it.

Steps (comma-separated, default all, in this order):
  check     pytest -m gpu tests/test_moe.py (the kernels against float64, compute-sanitizer memcheck)
  notebook  papermill notebooks/05_moe_verify.ipynb with parameterized_runs/default.yaml's GPU
            parameters and this call's ceilings (as a sweep passes the run's): its cells' durations
  dev       scripts/moe_dev.py (all: both router kernels and the torch router at T = 1 .. 128, then the whole
            layer with each router kernel at T = 17 and 65, model and Zipf routing)

After the notebook it prints, from its table: the kernel path's stage breakdown per T, the
whole layer's fraction of HBM bandwidth (minimum bytes over time) per variant, routing and T,
and the step model's validation table.
"""
import json
import os
import subprocess
import sys
import time

import yaml

OUT = os.environ["OUT"]
STEPS = (sys.argv[1] if len(sys.argv) > 1 else "check,notebook,dev").split(",")
DEADLINE = float(os.environ.get("DEADLINE", 170))
SHARE = {"check": 75, "notebook": 110, "dev": 35}
T0 = time.time()


def stamp(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def run(step, cmd, log):
    left = DEADLINE - (time.time() - T0)
    limit = min(SHARE[step], left - 2)
    if limit < 10:
        stamp(f"{step}: skipped ({left:.0f} s left)")
        return None
    with open(log, "w") as f:
        try:
            res = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=limit)
            stamp(f"{step}: exit {res.returncode}")
        except subprocess.TimeoutExpired:
            stamp(f"{step}: cut at {limit:.0f} s")
    return open(log).read()


from kdtree.bench.ceilings import measure_ceilings  # noqa: E402

c = measure_ceilings(quick=True)
c.save(f"{OUT}/ceilings.json")
stamp(c.caption())
if "check" in STEPS:
    out = run("check", [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/test_moe.py"], f"{OUT}/gpu_tests.log")
    if out is not None:
        stamp("gpu tests: " + (out.strip().splitlines() or ["?"])[-1])
if "notebook" in STEPS:
    spec = yaml.safe_load(open("parameterized_runs/default.yaml"))
    params = next(e["parameters"] for e in spec["notebooks"] if "05_moe_verify" in e["notebook"])
    params |= {"results_path": f"{OUT}/05", "ceilings_path": f"{OUT}/ceilings.json"}
    yaml.safe_dump(params, open("/tmp/params05.yaml", "w"))
    t = time.time()
    run("notebook", [sys.executable, "-m", "papermill", "notebooks/05_moe_verify.ipynb", f"{OUT}/05.ipynb",
                     "-f", "/tmp/params05.yaml", "--log-output"], "/tmp/papermill05.log")
    stamp(f"05 wall {time.time() - t:.1f} s")
    if os.path.exists(f"{OUT}/05.ipynb"):
        nb = json.load(open(f"{OUT}/05.ipynb"))
        total = 0.0
        for i, cell in enumerate(nb["cells"]):
            pm = cell.get("metadata", {}).get("papermill", {})
            if cell["cell_type"] == "code":
                d = pm.get("duration") or 0.0
                total += d
                print(f"  cell {i:2d} {pm.get('status', '?'):9s} {d:7.1f} s  {''.join(cell['source'])[:60]!r}")
        stamp(f"05 cells: {total:.1f} s of notebook time")
    print(open("/tmp/papermill05.log").read()[-1500:])
    if os.path.exists(f"{OUT}/05.parquet"):
        import pandas as pd

        pd.set_option("display.width", 250)
        pd.set_option("display.max_columns", 40)
        df = pd.read_parquet(f"{OUT}/05.parquet")
        b = df[df.table == "breakdown"]
        print(b.pivot_table(index=["path", "stage"], columns="tokens", values="median_us", sort=False).round(1))
        m = df[df.table == "moe"]
        print(m.pivot_table(index=["variant", "routing"], columns="tokens", values="median_us", sort=False).round(1))
        print(m.pivot_table(index=["variant", "routing"], columns="tokens", values="hbm_fraction", sort=False)
              .round(3))
        print("kernels per call:", m.groupby("variant", sort=False).kernels.first().to_dict())
        v = df[df.table == "validation"]
        print(v[["preset", "budget", "measured_us", "measured_p20_us", "measured_p80_us", "predicted_us", "ratio",
                 "predicted_cold_us", "ratio_cold", "measured_verify_us", "predicted_verify_us", "ratio_random"]]
              .round(3).to_string(index=False))
if "dev" in STEPS:
    out = run("dev", [sys.executable, "scripts/moe_dev.py"], f"{OUT}/dev.log")
    if out is not None:
        print(out[-6000:])
stamp("done")
