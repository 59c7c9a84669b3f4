"""kdtree: DDTree speculative decoding on MLA models, its GPU kernels, and a roofline workbook.

The import name is ``kdtree``; the distribution is ``kdtree-workbook`` (``kdtree`` on PyPI is
an unrelated k-d tree library).
"""
from kdtree.tree import Accepted, Tree, accept_tree, build_tree, compact_kv, topk_logprobs
from kdtree.attention import verify_attention

__version__ = "0.1.0"
__all__ = ["Accepted", "Tree", "accept_tree", "build_tree", "compact_kv", "topk_logprobs",
           "verify_attention"]
