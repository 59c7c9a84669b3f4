"""Small run of every verify_attention CUDA variant, for compute-sanitizer (test_attention.py).

    python tests/sanitize_attention.py [mma|wgmma|rows_n|tma|tma_seq|pair|rn72 ...]
    (default: every fused kernel available)

``mma``, ``wgmma``, ``tma``, ``tma_seq`` and ``pair`` select those kernels in the rows_m layout (cascade runs
too, and naive unless only TMA-fed kernels are picked); ``rows_n`` the wgmma kernel in the rows_n
layout and ``rn72`` the 72-row rows_n kernel (fused only).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from attention_cases import available_kernels, selfcheck  # noqa: E402

NAMES = {"mma": ("mma", "rows_m"), "wgmma": ("wgmma", "rows_m"), "rows_n": ("wgmma", "rows_n"),
         "tma": ("tma", "rows_m"), "tma_seq": ("tma_seq", "rows_m"), "pair": ("pair", "rows_m"),
         "rn72": ("rn72", "rows_n")}
picked = tuple(NAMES[a] for a in sys.argv[1:])
if picked and all(k[1] == "rows_n" for k in picked):
    variants = ("fused",)
elif picked and all(k[0] in ("tma", "tma_seq", "pair") for k in picked):
    variants = ("cascade", "fused")  # cascade on the picked kernel; naive has its own runs
else:
    variants = ("naive", "cascade", "fused")
sys.exit(0 if selfcheck(variants, kernels=picked or available_kernels()) else 1)
