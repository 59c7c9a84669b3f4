"""A sweep's run folder: its manifest (``run.json``), the record of every file a point wrote,
the checks that say whether a point is whole, and the lock that gives a run one writer.

``run.json`` holds, per point, ``files``: each file the point wrote (its notebook, its results
table's parquet, CSV and metadata, and ``ceilings.json`` when the point measured them), keyed
by its path relative to the run folder, with its size, sha256 and, for a parquet table, its row
count. A point is whole when every recorded file is there with that size and checksum; points
recorded before files were (older runs) are whole when their notebook parses and their table
reads. Paths in ``run.json`` are relative (to the run folder, or to the sweep's root), so a run
folder means the same on every machine.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import logging
import os
import socket
from pathlib import Path

from kdtree.bench.atomic import remove_temps, temp_name, write_text
from kdtree.checks import UserError

MANIFEST = "run.json"
LOCK = "run.lock"
log = logging.getLogger("kdtree.sweep")


class DamagedRun(ValueError):
    """A run folder whose manifest is missing or unreadable, or that holds nothing to show."""


class RunLocked(UserError):
    """Another live sweep holds the run folder's lock; ``holder`` is its lock record (the
    ``kdtree`` command prints the message as one line and exits with status 2)."""

    def __init__(self, run_dir: Path, holder: dict):
        self.holder = holder
        super().__init__(f"run {run_dir.name} is being written by another sweep (pid {holder.get('pid')} on "
                         f"{holder.get('host')}, since {holder.get('started')}); wait for it to finish, or "
                         f"delete {run_dir / LOCK} if that process is gone")


# ---- the manifest ----

def load_manifest(run_dir: str | Path) -> dict | None:
    """The raw ``run.json`` of ``run_dir``; None when there is none.

    Raises
    ------
    DamagedRun
        When ``run.json`` exists but is empty, truncated or not a run manifest.
    """
    f = Path(run_dir) / MANIFEST
    try:
        text = f.read_text()
    except FileNotFoundError:
        return None
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise DamagedRun(f"{f}: unreadable ({'empty' if not text.strip() else exc})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("points"), dict) or "run_id" not in manifest:
        raise DamagedRun(f"{f}: not a sweep manifest (no run_id or points)")
    return manifest


def write_manifest(run_dir: str | Path, manifest: dict) -> None:
    """Write ``run.json`` atomically (a unique temporary name, then a rename)."""
    write_text(Path(run_dir) / MANIFEST, json.dumps(manifest, indent=2, default=str) + "\n")


TWIN = "-twin"     # the second run of a pair of twins is named after the first with this suffix


def latest_run(out_root: str | Path, name: str | None = None) -> Path | None:
    """The most recently created run directory (of sweep ``name``, if given) under ``out_root``.

    A folder whose ``run.json`` is unreadable is skipped with a warning; the second run of a
    pair of twins (``run_sweep(twin=True)``) is not a candidate: its first run is.
    """
    runs = {}
    for d in sorted(Path(out_root).glob("*")):
        if not d.is_dir():
            continue
        try:
            m = load_manifest(d)
        except DamagedRun as exc:
            log.warning("skipping run folder %s: %s", d.name, exc)
            continue
        if m and m.get("run_id") == f"{m.get('twin')}{TWIN}":
            continue
        if m and (name is None or m.get("sweep") == name):
            runs[d] = str(m.get("created", ""))
    return max(runs, key=runs.get) if runs else None


# ---- the files of a point ----

def file_record(path: Path) -> dict:
    """Size and sha256 of ``path`` (and the row count of a parquet table).

    Raises
    ------
    ValueError
        When a parquet table or a notebook does not read back.
    """
    data = path.read_bytes()
    rec = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    problem = _unreadable(path)
    if problem:
        raise ValueError(f"{path.name}: {problem}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rec["rows"] = pq.read_metadata(path).num_rows
    return rec


def _unreadable(path: Path) -> str | None:
    """Why ``path`` (a notebook, a parquet table or a JSON file) does not read back, or None."""
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            pq.read_metadata(path)                # footer, schema and row count
        elif path.suffix in (".ipynb", ".json"):
            json.loads(path.read_text())
        return None
    except FileNotFoundError:
        return "missing"
    except Exception as exc:  # any reader error means the file is not whole
        return f"unreadable ({type(exc).__name__}: {str(exc)[:120] or 'empty'})"


def point_files(run_dir: Path, entry: dict) -> list[str]:
    """The paths (relative to the run folder) a point's entry names: notebook and results table."""
    names = [entry["output"]] if entry.get("output") else []
    if entry.get("results"):
        res = Path(entry["results"])
        names += [str(res), str(res.with_suffix(".csv")), str(res.with_suffix(".meta.json"))]
    return [n for n in names if (run_dir / n).exists() or n.endswith((".ipynb", ".parquet"))]


def damage(run_dir: str | Path, entry: dict) -> str | None:
    """Why a point recorded ``ok`` (or ``failed``, for its notebook) is not whole, or None."""
    run_dir = Path(run_dir)
    if entry.get("status") not in ("ok", "failed"):
        return None
    files = entry.get("files")
    if files is None:                   # recorded before files were, or failed before writing any
        if entry["status"] == "failed":
            names = [entry["output"]] if entry.get("output") and (run_dir / entry["output"]).exists() else []
        else:
            names = point_files(run_dir, entry) if entry.get("output") and entry.get("results") else [None]
        if None in names:
            return "its manifest entry names no files"
        for name in names:
            problem = _unreadable(run_dir / name)
            if problem:
                return f"{name} is {problem}"
        return None
    for name, rec in files.items():
        f = run_dir / name
        try:
            size = f.stat().st_size
        except FileNotFoundError:
            return f"{name} is missing"
        if size != rec.get("bytes"):
            what = "empty" if size == 0 else ("truncated" if size < rec.get("bytes", 0) else "changed")
            return f"{name} is {what} ({size} of {rec.get('bytes')} bytes)"
        if hashlib.sha256(f.read_bytes()).hexdigest() != rec.get("sha256"):
            return f"{name} does not match its checksum"
    return None


# ---- one writer per run ----

def _alive(holder: dict) -> bool:
    """Whether the lock's holder may still run: another host (cannot tell), or a live process
    of this host that started no later than the lock."""
    if holder.get("host") != socket.gethostname():
        return True
    try:
        pid = int(holder["pid"])
        started = _dt.datetime.fromisoformat(holder["started"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return False
    import psutil

    try:
        proc = psutil.Process(pid)
        return proc.create_time() <= started + 1 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


@contextlib.contextmanager
def run_lock(run_dir: str | Path):
    """Hold ``run_dir/run.lock`` (pid, host, start time) for the duration of the block.

    A lock left by a dead process of this host is taken over with a warning, as is an
    unreadable one. Temporary files of killed writers are cleared once the lock is held.

    Raises
    ------
    RunLocked
        When a live process (or one of another host) holds the lock.
    """
    run_dir = Path(run_dir)
    lock = run_dir / LOCK
    me = {"pid": os.getpid(), "host": socket.gethostname(),
          "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")}
    tmp = temp_name(lock)
    tmp.write_text(json.dumps(me) + "\n")
    try:
        for _ in range(5):
            try:
                os.link(tmp, lock)                          # atomic, fails when the lock exists
                break
            except FileExistsError:
                pass
            try:
                holder = json.loads(lock.read_text())
            except FileNotFoundError:
                continue                                    # released meanwhile: try again
            except ValueError:
                holder = {}
            if holder and _alive(holder):
                raise RunLocked(run_dir, holder)
            stale = temp_name(lock)
            try:
                os.rename(lock, stale)                      # one taker wins the stale lock
            except FileNotFoundError:
                continue
            stale.unlink()
            log.warning("run %s: took over the lock of %s", run_dir.name,
                        f"pid {holder.get('pid')} on {holder.get('host')} (no longer running)" if holder
                        else "an unreadable run.lock")
        else:
            raise RunLocked(run_dir, {"pid": "?", "host": "?", "started": "?"})
    finally:
        tmp.unlink(missing_ok=True)
    try:
        for f in remove_temps(run_dir):
            log.info("removed %s, left by a killed writer", f.relative_to(run_dir))
        yield
    finally:
        with contextlib.suppress(FileNotFoundError, ValueError):
            if json.loads(lock.read_text()) == me:
                lock.unlink()
