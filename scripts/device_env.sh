# Sourced by the one-call GPU scripts, from the repository root: the Python environment and the
# notebook stack (papermill, plotly, dask, ...) from the offline wheelhouse when the checkout
# carries one (`kdtree wheelhouse --dest .whl`; device calls carry `.whl`) and the stack is not
# installed yet (a warm machine keeps it between calls). The git commit is
# left to the caller (KDTREE_GIT_SHA): a copied checkout's own .git may be stale.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [ -d .whl ] && ! python3 -c "import papermill, nbconvert, ipykernel, plotly, dask, distributed, fastparquet, pynvml" 2>/dev/null; then
    python3 -m pip install -q --no-index --find-links .whl papermill nbconvert nbformat nbclient ipykernel \
        plotly dask distributed fastparquet nvidia-ml-py 2>&1 | tail -2
fi
# Where Python may not write bytecode beside the stack's sources (a read-only venv, or
# PYTHONDONTWRITEBYTECODE), every process compiles the modules torch imports lazily again: a 03
# notebook on the H200 host compiled 872 of them from source (3 s, torch._dynamo and the rest), and
# a sweep starts one notebook kernel per point. Keep the bytecode under /tmp for the call instead.
if python3 -c "import importlib.util as u, os, sys; d = u.find_spec('torch').submodule_search_locations[0]; sys.exit(0 if sys.flags.dont_write_bytecode or not os.access(os.path.join(d, '__pycache__'), os.W_OK) else 1)" 2>/dev/null; then
    unset PYTHONDONTWRITEBYTECODE
    export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/kdtree_pycache}
fi
