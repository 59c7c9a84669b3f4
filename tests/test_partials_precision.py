"""scripts/partials_precision.py: the CPU emulation of the split merge's accuracy."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from partials_precision import merged_error  # noqa: E402


def _err(fmt, splits=4):
    return merged_error(256, 1024, splits, fmt, torch.Generator().manual_seed(3))


def test_fp32_partials_cost_nothing_beyond_the_output_rounding_and_bf16_partials_a_little():
    alone, fp32, bf16 = _err(None), _err(torch.float32), _err(torch.bfloat16)
    assert 1e-3 < alone < 3e-3                          # one bf16 rounding of N(0, 1)-scale rows
    assert abs(fp32 - alone) < 0.01 * alone
    assert alone * 1.05 < bf16 < alone * 1.6            # a second rounding, damped by the weights


def test_one_split_in_bf16_is_two_roundings_of_the_same_row():
    # one split: the partial is the normalised row itself, rounded to bf16 and then again (a no-op)
    assert _err(torch.bfloat16, splits=1) == _err(None)
