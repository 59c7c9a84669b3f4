"""Execute one notebook with papermill, quietly: the kernel talks to papermill over IPC sockets
in a private temporary folder (no TCP ports, so no "running over TCP without encryption"
warning), and the kernel process's own log (its stderr) goes to a temporary file that is
replayed afterwards without the lines every kernel start and stop writes (nor the traceback of
a known race in ipykernel's shutdown). What a notebook's cells print, and the errors they raise,
are in the executed notebook as always.
"""
from __future__ import annotations

import os
import sys
import tempfile

# Lines of the kernel's own log that say nothing about the notebook.
KERNEL_NOISE = ("Kernel is running over TCP without encryption", "KeyboardInterrupt caught in kernel",
                "Parent appears to have exited, shutting down")
# The last line of a traceback the kernel logs when a shutdown request races its own IOPub
# thread's close (ipykernel 7: the control handler flushes stdout into a pipe already closed).
# The notebook has finished and been saved by then; it says nothing about the notebook either.
SHUTDOWN_RACE = "zmq.error.ZMQError: Socket operation on non-socket"


def kernel_log_lines(lines) -> list[str]:
    """The lines of a kernel's log worth showing: blank lines, ``KERNEL_NOISE`` lines and the
    shutdown race's traceback (with the line that announced it) left out. A traceback ends at its
    first unindented line, the exception; any other traceback is kept whole."""
    kept: list[str] = []
    block: list[str] | None = None                       # the traceback being read, if any
    for line in (raw.rstrip() for raw in lines):
        if block is not None:
            block.append(line)
            if line[:1].isspace() or not line:
                continue
            if line.startswith(SHUTDOWN_RACE):
                if kept and "Uncaught exception" in kept[-1]:
                    kept.pop()
            else:
                kept.extend(block)
            block = None
        elif "Traceback (most recent call last):" in line:
            block = [line]
        elif line.strip() and not any(n in line for n in KERNEL_NOISE):
            kept.append(line)
    return kept + (block or [])


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
                for line in kernel_log_lines(log):
                    print(f"[{label} kernel] {line}", file=sys.stderr)
