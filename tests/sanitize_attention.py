"""Small run of every verify_attention CUDA variant, for compute-sanitizer (test_attention.py)."""
import sys

from kdtree.attention import selfcheck

sys.exit(0 if selfcheck() else 1)
