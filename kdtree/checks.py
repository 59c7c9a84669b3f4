"""Argument checks shared by the public ops: each raises naming the argument, before any launch."""
from __future__ import annotations

import torch

INT32_MAX = 2**31 - 1


class UserError(Exception):
    """A request that cannot be carried out as asked (a bad argument, a missing or locked run).

    The ``kdtree`` command prints the message of a UserError, like that of a ValueError or
    TypeError, as one line and exits with status 2; a library caller catches it like any error.
    """


def check_storage(name: str, t) -> None:
    """``t`` is a torch tensor with data (not on the meta device) that does not require grad.

    The ops launch kernels on raw memory and write in place: they are not differentiable, and a
    meta tensor has no memory to read. (The checks here build their messages only when they
    fail: an eager op runs several of them per call, on the host's critical path.)
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.is_meta:
        raise ValueError(f"{name}: is a meta tensor (shape only, no data); pass a tensor on a real device")
    if t.requires_grad:
        raise ValueError(f"{name}: requires grad; kdtree ops are not differentiable (pass {name}.detach())")


def check_tensor(name: str, t, dtypes: tuple, ndim: int | None = None, device=None) -> None:
    """``t`` is a contiguous torch tensor of one of ``dtypes`` (and ``ndim`` dims, on ``device``),
    with data and not requiring grad (:func:`check_storage`)."""
    check_storage(name, t)
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype {' or '.join(str(d) for d in dtypes)}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected device {device}, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (call .contiguous())")


def reads_values(validate: bool, device: torch.device) -> bool:
    """Whether the value checks run: asked for, and not inside a CUDA-graph capture (reading a
    value synchronises with the host, which a capture cannot do)."""
    return validate and not (device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def check_token_ids(name: str, t: torch.Tensor, low: int = 0) -> None:
    """Every id of ``t`` lies in ``low .. 2**31 - 1``: the trees hold tokens as int32, and -1 is
    their padding value. Reads the values (a host synchronisation)."""
    if t.numel() == 0:
        return
    lo, hi = int(t.min()), int(t.max())
    if not (low <= lo and hi <= INT32_MAX):
        raise ValueError(f"{name}: token ids must lie in {low}..{INT32_MAX} (int32), got values in {lo}..{hi}")
