#!/bin/sh
# Timing runs (noisy on a shared machine: the load average is logged with each).
cd "$(dirname "$0")"; mkdir -p out
o=out/timing_$(date +%H%M).txt
t() { echo "\$ ./run.sh $*   [$(uptime | sed 's/.*load/load/')]" >> $o
      ./run.sh "$@" 2>&1 | grep -v -e cudart_stub -e "All log messages" -e "^W0000" -e "^I0000" -e "^WARNING" >> $o; }
t k3 q2_timing.py --rounds 40
t tf215 q2_timing.py --rounds 40
t k3 q3_host.py --rounds 25
for v in memcpy one_fn eager_loop; do t k3 q3_restore.py $v; done
t k3 q2_pack.py
t k3 q6_overhead.py --reps 7
t k3 q6_overhead.py --width 1024 --batches 100 --batch 256 --reps 5
echo "done [$(uptime | sed 's/.*load/load/')]" >> $o
