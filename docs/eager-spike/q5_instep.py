"""Q5: an in-step snapshot inside the user's tf.function train step. Does TF 2's
automatic control dependency tracking order the copy before the optimizer's
update? Checks slot == pre-step values bit for bit over many steps with large
variables (weights + optimizer state), with and without XLA, plus the if_finite
gate (tf.cond), and a negative control (copy placed after the update) that the
check must catch.
Usage: run.sh k3|tfk|tf215 q5_instep.py [--steps 200]
"""
import argparse
from common import *
ap = argparse.ArgumentParser(); ap.add_argument("--steps", type=int, default=200)
args = ap.parse_args()

keras.utils.set_random_seed(0)
D = 1024   # Dense(1024 -> 1024): 4 MiB kernels
layers = keras.layers
model = keras.Sequential([layers.Dense(D, activation="tanh"), layers.Dense(D, activation="tanh"), layers.Dense(1)])
model.build((None, D))
opt = keras.optimizers.Adam(1e-3)
opt.build(model.trainable_variables)
def unwrap(v): return v.value if K3 else v
opt_vars = opt.variables() if callable(opt.variables) else opt.variables
covered = [unwrap(v) for v in model.variables] + [unwrap(v) for v in opt_vars]
if K3:   # leave Keras 3's learning-rate variable out (see Q6)
  covered = [v for v in covered if "learning_rate" not in v.name]
shadows = []
for v in covered:
  with tf.init_scope(), tf.device(v.device):
    shadows.append(tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False))

def copy_ops():       # what the store would expose: emits the copies
  for s, v in zip(shadows, covered):
    s.assign(v.read_value(), read_value=False)

copy_fn = tf.function(copy_ops, autograph=False)   # the store's own traced copy

def copy_if_finite(loss):
  def do():
    copy_ops(); return tf.constant(True)
  return tf.cond(tf.reduce_all(tf.math.is_finite(loss)), do, lambda: tf.constant(False))

def make_step(where, jit):
  @tf.function(jit_compile=jit, autograph=False)
  def step(x, y):
    if where == "before":
      copy_ops()
    if where == "nested":   # the store's tf.function called inside the step
      copy_fn()
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    if where == "if_finite":
      copied = copy_if_finite(loss)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    if where == "after":   # negative control
      copy_ops()
    return loss
  return step

rng = np.random.RandomState(1)
def batch(bad=False):
  x = rng.standard_normal((32, D)).astype(np.float32)
  if bad: x[0, 0] = np.nan   # (inf would saturate tanh: finite loss)
  return tf.constant(x), tf.constant(rng.standard_normal((32, 1)).astype(np.float32))

for where, jit in [("before", False), ("before", True), ("nested", False), ("nested", True), ("after", False), ("if_finite", False), ("if_finite", True)]:
  step = make_step(where, jit)
  mismatches = 0; last_good = None; n = args.steps if where != "after" else 10
  for i in range(n):
    bad = where == "if_finite" and i % 7 == 3
    pre = [v.numpy() for v in covered]
    x, y = batch(bad)
    loss = step(x, y)
    assert np.isfinite(loss.numpy()) != bad
    if bad:
      # slot must still hold the last finite step's start; then roll back
      want = last_good
    else:
      want = pre; last_good = pre
    ok = all(same_bits(s.numpy(), w) for s, w in zip(shadows, want))
    mismatches += not ok
    if bad:   # roll back so training goes on from finite values
      for v, w in zip(covered, last_good): v.assign(w)
  print("%-9s jit=%-5s steps=%3d  slot != expected pre-step state: %d  traces=%d  (%d vars, %.0f MiB)" % (
      where, jit, n, mismatches, step.experimental_get_tracing_count(), len(covered),
      sum(v.shape.num_elements() * v.dtype.size for v in covered) / 2**20))

# Overhead of the in-step copy vs the bare compiled step (interleaved medians).
import gc
x, y = batch()
steps = {w: make_step(w, False) for w in ["none", "before", "if_finite"]}
for f in steps.values(): f(x, y); f(x, y)
ts = {w: [] for w in steps}
for r in range(30):
  for w, f in steps.items():
    a = time.perf_counter(); f(x, y).numpy(); ts[w].append(time.perf_counter() - a)
b = np.median(ts["none"])
print("step time, median of 30: bare %.2f ms; with copy %.2f ms (x%.3f); if_finite copy %.2f ms (x%.3f)" % (
    b * 1e3, np.median(ts["before"]) * 1e3, np.median(ts["before"]) / b,
    np.median(ts["if_finite"]) * 1e3, np.median(ts["if_finite"]) / b))
