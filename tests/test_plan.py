"""``kdtree plan``: a verify call's launch plan and roof floors on a measured device, without a GPU.

Run as users run it (the command, on a committed run's ceilings) and, for what the table says
about shapes, through ``kdtree.bench.plan.plan_table``."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kdtree.attention import launch_plan
from kdtree.bench.ceilings import Ceilings
from kdtree.bench.plan import ROOFS, plan_table
from kdtree.bench.roofline import ROOF_LABELS

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "parameterized_runs" / "h200-20261202-2"
CEILINGS = Ceilings.load(RUN / "ceilings.json")
ROOF_NAMES = {ROOF_LABELS[r] for r in ROOFS}


def test_the_command_prints_each_variants_plan_and_binding_roof():
    """On the Kimi K2 shards at batch 1 and 8 (N = 65, H = 8, P = 4096): one line per shape and
    variant, the shapes in the order asked, fused's plan as ``launch_plan`` makes it (a head/tail
    launch at batch 8), and each line's floor the largest of its roofs, named in the bound column."""
    res = subprocess.run([sys.executable, "-m", "kdtree.cli", "plan", RUN.name, "--runs", str(RUN.parent),
                          "--batch", "1,8", "--nodes", "65", "--heads", "8", "--prefix", "4096"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    head, blank, cols, *rows = res.stdout.splitlines()
    assert CEILINGS.device in head and str(RUN / "ceilings.json") in head and blank == ""
    header = re.split(r"\s{2,}", cols.strip())
    cells = [dict(zip(header, re.split(r"\s{2,}", row.strip()))) for row in rows]
    assert [(c["B"], c["variant"]) for c in cells] == [(b, v) for b in "18" for v in ("fused", "cascade", "naive")]
    p = launch_plan("fused", batch=8, nodes=65, heads=8, kv_rows=4161, num_sms=132)
    assert p.head > 0 and cells[3]["plan"] == (f"{p.impl} {p.layout} {p.splits} splits, head {p.head} row tiles, "
                                               f"tail {p.tail_splits} splits")
    for cell in cells:
        roofs = {n[:-3]: float(c) for n, c in cell.items() if n[:-3] in ROOF_NAMES and c != "-"}
        floor = float(cell["floor us"])
        assert max(roofs.values()) == pytest.approx(floor, abs=0.05) and roofs[cell["bound"]] == floor


def test_csv_holds_the_table_the_text_shows():
    """``--csv``: plan_table's rows for every shape asked, in order, as the command's only output."""
    import io

    import pandas as pd

    res = subprocess.run([sys.executable, "-m", "kdtree.cli", "plan", str(RUN / "ceilings.json"), "--batch", "1,64",
                          "--nodes", "9", "--heads", "8,16", "--prefix", "16384", "--variants", "fused,cascade",
                          "--csv"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    got = pd.read_csv(io.StringIO(res.stdout))
    want = pd.concat([plan_table(CEILINGS, batch=b, nodes=9, heads=h, prefix=16384, variants=("fused", "cascade"))
                      for b in (1, 64) for h in (8, 16)], ignore_index=True)
    assert list(got.columns) == list(want.columns) and len(got) == 8
    text = ["variant", "impl", "layout", "bound"]
    assert got[text].equals(want[text])
    numbers = [c for c in want.columns if c not in text]
    assert got[numbers].isna().equals(want[numbers].isna())
    assert ((got[numbers] - want[numbers]).abs() <= 1e-5 * want[numbers].abs().fillna(0) + 1e-9).fillna(True).all().all()


def test_the_roofs_follow_the_shape():
    """A longer prefix adds at least its cache rows' bytes to every variant's HBM bytes; a warm L2
    lets a call whose bytes fit take no HBM time; no variant's floor beats the ideal (which is the
    same for all)."""
    shape = dict(batch=8, nodes=65, heads=8)
    short, long = (plan_table(CEILINGS, prefix=p, **shape).set_index("variant") for p in (4096, 32768))
    assert (long.hbm_mb - short.hbm_mb >= 8 * (32768 - 4096) * 576 * 2 / 1e6).all()
    assert (long.hbm_us / short.hbm_us < (32768 + 65) / (4096 + 65)).all()   # q, out, partials do not grow as fast
    small = dict(batch=1, nodes=9, heads=8, prefix=1024)
    cold, warm = (plan_table(CEILINGS, l2=state, **small).set_index("variant") for state in ("cold", "warm"))
    assert (cold.hbm_us > 0).all() and (warm.loc[["fused", "cascade"], "hbm_us"] == 0).all()
    for t in (short, long, cold, warm):
        assert t.ideal_us.nunique() == 1 and (t.floor_us >= t.ideal_us * (1 - 1e-9)).all()
        assert (t.floor_us == t[[f"{r}_us" for r in ROOFS]].max(axis=1)).all()


@pytest.mark.parametrize("kw,word", [(dict(batch=0), "batch"), (dict(prefix=-1), "prefix"), (dict(heads=2.0), "heads"),
                                     (dict(variants=("torch",)), "variants"), (dict(l2="hot"), "l2")])
def test_bad_arguments_name_themselves(kw, word):
    args = dict(batch=1, nodes=9, heads=8, prefix=0) | kw
    with pytest.raises(ValueError, match=f"^{word}: "):
        plan_table(CEILINGS, **args)
