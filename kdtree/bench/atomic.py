"""Whole files or none: every file of a run is written under a unique temporary name beside its
destination and renamed into place, so a reader (or a resumed sweep) never sees half a file,
and two writers never share a temporary name.

A killed writer leaves its temporary file behind (``.<name>.<pid>-<random>.kdtmp<suffix>``);
:func:`remove_temps` clears them from a run folder whose lock the caller holds.
"""
from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

TMP_MARK = ".kdtmp"


def temp_name(path: str | Path) -> Path:
    """A fresh temporary path beside ``path`` that keeps its suffix (papermill wants ``.ipynb``)."""
    path = Path(path)
    return path.with_name(f".{path.stem}.{os.getpid()}-{uuid.uuid4().hex[:8]}{TMP_MARK}{path.suffix}")


@contextlib.contextmanager
def atomic_path(path: str | Path, *, keep_on_error: bool = False):
    """Yield a temporary path; when the block ends, rename what was written there onto ``path``.

    Parameters
    ----------
    path : path
        The destination; its folder is created.
    keep_on_error : bool
        Rename the temporary file into place even when the block raises (a failed point's
        notebook is kept for its report); by default it is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    try:
        yield tmp
    except BaseException:
        if keep_on_error and tmp.exists():
            os.replace(tmp, path)
        raise
    else:
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (flushed to disk before the rename)."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return Path(path)


def remove_temps(folder: str | Path) -> list[Path]:
    """Delete the temporary files that killed writers left under ``folder``; returns them."""
    found = [p for p in Path(folder).rglob(f".*{TMP_MARK}*") if p.is_file()]
    for p in found:
        p.unlink(missing_ok=True)
    return found
