"""Small run of every verify_attention CUDA variant, for compute-sanitizer (test_attention.py).

    python tests/sanitize_attention.py [mma|wgmma ...]   (default: every fused kernel available)
"""
import sys

from kdtree.attention import selfcheck

sys.exit(0 if selfcheck(impls=tuple(sys.argv[1:]) or None) else 1)
