#!/bin/bash
# Every graph-mode bench on TF 1.15 (.venv/) and TF 2.21 (.venv-tf2/, compat.v1
# graph mode) with the same arguments, the two stacks one after the other for
# each bench, so that both see about the same machine. Writes
# OUT/<bench>_<stack>.{txt,json}; bench/compare_stacks.py OUT prints the
# side-by-side tables. The TF 1.15 bench_scale run also draws
# bench/results/scale.png. (bench_eager.py is TF 2.x only: run it on its own.)
#   bench/run_both_stacks.sh bench/results/<date>_sidebyside
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: bench/run_both_stacks.sh OUTPUT_DIR}
mkdir -p "$OUT"
export TF_CPP_MIN_LOG_LEVEL=2
run() {  # name stack python args...
  local name=$1 st=$2 py=$3; shift 3
  local extra=()
  [ "$name" = bench_scale ] && [ "$st" = tf115 ] && extra=(--plot bench/results/scale.png)
  [ "$name" = bench_scale ] && [ "$st" = tf221 ] && extra=(--plot $OUT/scale_tf221.png)
  {
    echo "\$ $py bench/$name.py $* --json $OUT/${name}_$st.json ${extra[*]}"
    echo "start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
    s=$(date +%s)
    $py bench/$name.py "$@" --json $OUT/${name}_$st.json "${extra[@]}"
    echo "exit $? after $(( $(date +%s)-s )) s; load $(cut -d' ' -f1-3 /proc/loadavg)"
  } > $OUT/${name}_$st.txt 2>&1
  echo "$name $st done $(date -u +%H:%M:%S)" >> $OUT/progress.log
}
for b in "bench_core" "bench_scale --num-vars 100 300 1000 2000" "bench_setup" "bench_training" "bench_disk" "bench_ensemble" "bench_rewire"; do
  set -- $b
  name=$1; shift
  run $name tf115 .venv/bin/python "$@"
  TF_USE_LEGACY_KERAS=1 run $name tf221 .venv-tf2/bin/python "$@"
done
echo "all done $(date -u +%H:%M:%S)" >> $OUT/progress.log
