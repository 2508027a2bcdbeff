#!/bin/sh
# Runs every spike script and saves its output under out/ (filtered of TF's
# start-up noise). Timing scripts are noisy on a shared 2-core machine: rerun
# them when the machine is idle (see FINDINGS.md for the numbers quoted).
cd "$(dirname "$0")"
mkdir -p out
run() {  # run <outfile> <stack> <script> [args]
  o=$1; shift
  echo "\$ ./run.sh $*" >> out/$o
  ./run.sh "$@" 2>&1 | grep -v -e cudart_stub -e "All log messages before absl" \
      -e "^E0000" -e "^I0000" -e "^W0000" -e "cuda_dnn\|cuda_fft\|cuda_blas" -e "^INFO:" >> out/$o
}
rm -f out/*.txt
run q1.txt k3 q1_vars_keras3.py; run q1.txt k3 q1_keys_keras3.py; run q1.txt k3 q1_lossscale.py
run q1.txt tfk q1_vars_keras2.py; run q1.txt tf215 q1_vars_keras2.py
for s in k3 tfk tf215; do run q1.txt $s q1_module.py; done
for s in k3 tfk tf215; do run q2.txt $s q2_untracked.py; done
run q2.txt k3 q2_warning.py; run q2.txt k3 q2_cow.py; run q2.txt k3 q2_device.py
run q2.txt tf215 q2_cow.py
run q3.txt k3 q3_convert.py; run q3.txt k3 q3_host.py
for s in k3 tfk tf215; do run q4.txt $s q4_swap.py; done
for s in k3 tfk tf215; do run q5.txt $s q5_instep.py; done
run q6.txt k3 q6_logs_keras3.py
for a in "" "--cover weights,seeds,opt,metrics" "--cover weights,seeds,opt,iters" "--cover weights" \
         "--dropout 0.3" "--dropout 0.3 --cover weights,opt,iters,metrics" "--bad 0" "--jit true" \
         "--spe 4" "--mode instep" "--mode instep --spe 4" "--mode instep --spe 4 --jit true --bad 0" \
         "--mode instep --spe 4 --jit true --bad 0 --clean-same-program" \
         "--mode instep --jit true --dropout 0.3 --clean-same-program"; do
  run q6_rollback.txt k3 q6_rollback_fit.py $a
done
for s in tfk tf215; do
  for a in "" "--dropout 0.3 --cover weights,opt,iters,metrics" "--jit true --bad 0"; do
    run q6_rollback.txt $s q6_rollback_fit.py $a
  done
done
run q6_rollback.txt tfk q6_rollback_fit.py --dropout 0.3 --tf-generator
run q6_rollback.txt tfk q6_rollback_fit.py --dropout 0.3 --tf-generator --cover weights,opt,iters,metrics
for s in k3 tfk tf215; do run q7.txt $s q7_checkpoints.py; done
for s in k3 tfk tf215; do run q8.txt $s q8_context.py; done
for s in k3 tf215; do run q9.txt $s q9_mirrored.py; done
