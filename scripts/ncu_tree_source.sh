export PYTHONPATH=$PWD
python3 -m pytest -q -m gpu tests/test_tree_gpu.py 2>&1 | tail -3
ncu --clock-control none -k build_tree -c 1 --section WarpStateStats --section SourceCounters --section InstructionStats python3 scripts/profile_tree.py --ncu 2>&1 | grep -vE "^==PROF==" > $OUT/ncu_src.txt
grep -A40 "Source Counters" $OUT/ncu_src.txt | head -60
grep -E "Executed Instructions|Cycles Per Issued" $OUT/ncu_src.txt
