"""Argument checks shared by the public ops: each raises naming the argument, before any launch."""
from __future__ import annotations

import torch


def need(cond: bool, exc: type, msg: str) -> None:
    """Raise ``exc(msg)`` unless ``cond``."""
    if not cond:
        raise exc(msg)


def check_tensor(name: str, t, dtypes: tuple, ndim: int | None = None, device=None) -> None:
    """``t`` is a contiguous torch tensor of one of ``dtypes`` (and ``ndim`` dims, on ``device``)."""
    need(isinstance(t, torch.Tensor), TypeError, f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    need(t.dtype in dtypes, TypeError, f"{name}: expected dtype {' or '.join(str(d) for d in dtypes)}, got {t.dtype}")
    if ndim is not None:
        need(t.dim() == ndim, ValueError, f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if device is not None:
        need(t.device == device, ValueError, f"{name}: expected device {device}, got {t.device}")
    need(t.is_contiguous(), ValueError, f"{name}: expected a contiguous tensor (call .contiguous())")
