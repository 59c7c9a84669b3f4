"""Execute one notebook with papermill, quietly: the kernel talks to papermill over IPC sockets
in a private temporary folder (no TCP ports, so no "running over TCP without encryption"
warning), and the kernel process's own log (its stderr) goes to a temporary file that is
replayed afterwards without the lines every kernel start and stop writes. What a notebook's
cells print, and the errors they raise, are in the executed notebook as always.
"""
from __future__ import annotations

import os
import sys
import tempfile

# Lines of the kernel's own log that say nothing about the notebook.
KERNEL_NOISE = ("Kernel is running over TCP without encryption", "KeyboardInterrupt caught in kernel",
                "Parent appears to have exited, shutting down")


def _manager_class(log):
    """An AsyncKernelManager whose kernel writes its stderr to the open file ``log``."""
    from jupyter_client import AsyncKernelManager

    class QuietKernelManager(AsyncKernelManager):
        async def _async_launch_kernel(self, kernel_cmd, **kw):
            kw["stderr"] = log
            return await super()._async_launch_kernel(kernel_cmd, **kw)

    return QuietKernelManager


def execute_notebook(source: str, output: str, parameters: dict, *, cwd: str, kernel_name: str,
                     timeout: float | None, label: str) -> None:
    """Run ``source`` with ``parameters`` into ``output`` (papermill), cells timed out after
    ``timeout`` seconds; the kernel's own log lines that are not noise are printed to stderr,
    each prefixed with ``label``.

    Raises
    ------
    papermill.PapermillExecutionError
        When a cell raised (the output notebook holds the traceback).
    """
    import papermill as pm
    from traitlets.config import Config

    with tempfile.TemporaryDirectory(prefix="kdtree-kernel-") as tmp:
        log_path = os.path.join(tmp, "kernel.log")
        try:
            with open(log_path, "w") as log:
                ipc = Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(tmp, "k")}})
                pm.execute_notebook(source, output, parameters=parameters, cwd=cwd, kernel_name=kernel_name,
                                    progress_bar=False, log_output=False, execution_timeout=timeout,
                                    config=ipc, kernel_manager_class=_manager_class(log))
        finally:
            with open(log_path, errors="replace") as log:
                for line in log:
                    if line.strip() and not any(n in line for n in KERNEL_NOISE):
                        print(f"[{label} kernel] {line.rstrip()}", file=sys.stderr)
