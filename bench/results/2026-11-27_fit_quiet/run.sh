#!/bin/bash
cd /work/main
while pgrep -f "run25.sh|run25b.sh" > /dev/null; do sleep 10; done
D=bench/results/2026-11-27_fit_quiet
date -u +"keras3 start %H:%M:%S" >> $D/times.txt
TF_USE_LEGACY_KERAS=0 .venv-tf2/bin/python bench/bench_eager.py --fit-only --json $D/bench_eager_keras3.json > $D/bench_eager_keras3.txt 2>&1
date -u +"tf-keras start %H:%M:%S" >> $D/times.txt
TF_USE_LEGACY_KERAS=1 .venv-tf2/bin/python bench/bench_eager.py --fit-only --json $D/bench_eager_tfkeras.json > $D/bench_eager_tfkeras.txt 2>&1
date -u +"end %H:%M:%S" >> $D/times.txt
echo done
