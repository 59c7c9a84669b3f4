"""scripts/ncu_rank.py on committed Nsight Compute exports (an H200 run of the `tma` verify kernel):
three views of the same warp-state samples must agree."""
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RANK = runpy.run_path(str(ROOT / "scripts" / "ncu_rank.py"))
EXPORTS = ROOT / "results" / "ncu_stalls_h200" / "6a0d890"


def test_source_lines_and_raw_reasons_count_the_same_samples():
    """The per-line samples of the source export sum to the raw export's sample count, and so do
    its per-reason samples; the per-opcode sums lose nothing."""
    lines, per_op = RANK["source_samples"](str(EXPORTS / "tma_source.csv.gz"))
    [(kernel, reasons, count)] = RANK["raw_stalls"](str(EXPORTS / "tma_raw.csv"))
    assert kernel.startswith("verify_fused_tma")
    assert len(lines) > 1000 and all(sass for _, _, sass in lines)
    assert sum(v for v, _, _ in lines) == count == sum(reasons.values())
    assert sum(per_op.values()) == count
    assert {"long_scoreboard", "barrier", "wait", "selected"} <= set(reasons)


def test_opcode_drops_the_predicate_and_the_modifiers():
    assert RANK["opcode"]("@!P0  BRA 0x7f800dadbb00") == "BRA"
    assert RANK["opcode"]("HGMMA.64x256x16.F32.BF16 R24, gdesc[UR4].tnspB, R24, gsb0") == "HGMMA"
    assert RANK["opcode"]("") == "?"
