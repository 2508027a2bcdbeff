#!/bin/bash
# issue 25: host path under a pinned spin load, both stacks
cd /work/main
D=bench/results/2026-11-27_issue25_pinned
T2="env TF_USE_LEGACY_KERAS=1 .venv-tf2/bin/python"
T1=".venv/bin/python"
$T2 bench/bench_core.py --load 2 --load-pin --json $D/bench_core_tf221_pin_run1.json > $D/bench_core_tf221_pin_run1.txt 2>&1
for r in 2 3; do
  $T1 bench/bench_core.py --load 2 --load-pin --json $D/bench_core_tf115_pin_run$r.json > $D/bench_core_tf115_pin_run$r.txt 2>&1
  $T2 bench/bench_core.py --load 2 --load-pin --json $D/bench_core_tf221_pin_run$r.json > $D/bench_core_tf221_pin_run$r.txt 2>&1
done
$T1 bench/bench_core.py --load 2 --json $D/bench_core_tf115_unpinned.json > $D/bench_core_tf115_unpinned.txt 2>&1
$T2 bench/bench_core.py --load 2 --json $D/bench_core_tf221_unpinned.json > $D/bench_core_tf221_unpinned.txt 2>&1
$T1 bench/probe_host_path.py --repeats 15 --load 2 --load-pin > $D/probe_tf115_pin.txt 2>&1
$T2 bench/probe_host_path.py --repeats 15 --load 2 --load-pin > $D/probe_tf221_pin.txt 2>&1
echo done
