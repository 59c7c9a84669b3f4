"""Measuring kdtree's kernels: timing, ceilings, models, sweeps and reports."""
