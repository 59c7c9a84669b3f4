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
