"""An offline wheelhouse of the notebook stack, for GPU hosts that reach no package index.

Build it where pip reaches PyPI, for the GPU host's Python (3.12, manylinux x86_64)::

    kdtree wheelhouse --dest .whl [--skip-installed host-freeze.txt]

then, on the GPU host (the folder travels with the checkout)::

    python3 -m pip install --no-index --find-links .whl \
        papermill nbconvert nbformat nbclient ipykernel plotly pyyaml tqdm pandas fastparquet dask distributed \
        nvidia-ml-py

or, where site-packages is read-only::

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site

``--skip-installed`` takes ``pip list --format=freeze`` of the host and leaves out what the host
already has (its torch image carries numpy, jinja2 and friends), keeping the wheelhouse small.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

# What executing the notebooks and rendering reports needs besides torch. jupyterlab is for
# interactive use only and stays out (large; the host runs headless). Parquet goes through
# fastparquet (a few MB) rather than pyarrow (over 50 MB, near the 64 MB a device call carries);
# pandas uses it when pyarrow is absent.
STACK = ("papermill", "nbconvert", "nbformat", "nbclient", "ipykernel", "plotly", "pyyaml", "tqdm",
         "pandas", "fastparquet", "dask", "distributed", "nvidia-ml-py")
# Every torch host has these; their wheels are left out.
HOST_HAS = ("numpy",)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_project(filename: str) -> str:
    """Canonical project name of a wheel file name (``Jinja2-3.1.4-py3-none-any.whl`` -> ``jinja2``)."""
    if not filename.endswith(".whl") or filename.count("-") < 4:
        raise ValueError(f"not a wheel file name: {filename!r}")
    return _canon(filename.split("-")[0])


def installed_names(freeze_file: str | Path) -> set[str]:
    """Project names in a ``pip list --format=freeze`` (or ``pip freeze``) listing."""
    names = set()
    for line in Path(freeze_file).read_text().splitlines():
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
        if m and not line.lstrip().startswith("#"):
            names.add(_canon(m.group(1)))
    return names


def build_wheelhouse(dest: str | Path = ".whl", *, packages=STACK, python_version: str = "3.12",
                     skip_installed: str | Path | None = None) -> Path:
    """Download binary wheels of ``packages`` and their dependencies for the GPU host.

    Parameters
    ----------
    dest : path
        Folder for the wheels (``.whl`` is git-ignored).
    packages : sequence of str
        Requirements to resolve; default the notebook stack.
    python_version : str
        The host's Python, e.g. ``"3.12"``.
    skip_installed : path, optional
        A ``pip list --format=freeze`` of the host; wheels of projects listed there are removed,
        as are those of :data:`HOST_HAS`.

    Returns
    -------
    Path
        ``dest``.
    """
    if not re.fullmatch(r"3\.\d+", python_version):
        raise ValueError(f"python_version: expected like '3.12', got {python_version!r}")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version", python_version,
           "--implementation", "cp", "-d", str(dest)]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    subprocess.run(cmd + list(packages), check=True)
    have = {_canon(n) for n in HOST_HAS} | (installed_names(skip_installed) if skip_installed else set())
    for whl in dest.glob("*.whl"):
        if wheel_project(whl.name) in have:
            whl.unlink()
    return dest
