"""Q6: cost of a snapshot before every batch in Keras 3 fit (callback, traced
copy into device shadows) and of the in-step copy, vs bare fit.
Usage: run.sh k3 q6_overhead.py [--width 64] [--batches 400] [--reps 5]"""
import argparse
from common import *
ap = argparse.ArgumentParser(); ap.add_argument("--width", type=int, default=64)
ap.add_argument("--batches", type=int, default=400); ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--batch", type=int, default=32)
args = ap.parse_args()
B = args.batch
rng = np.random.RandomState(0)
X = rng.randn(B * args.batches, 32).astype("f4"); Y = rng.randn(B * args.batches, 1).astype("f4")
def unwrap(v): return v.value if K3 else v
def make():
  keras.utils.set_random_seed(0)
  m = keras.Sequential([keras.Input((32,)), keras.layers.Dense(args.width, activation="relu"),
                        keras.layers.Dense(args.width, activation="relu"), keras.layers.Dense(1)])
  m.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
  return m
class Snap(keras.callbacks.Callback):
  def __init__(self, instep=False): super().__init__(); self.instep = instep
  def on_train_begin(self, logs=None):
    if hasattr(self, "snap"): return          # built once (the warm-up fit)
    m = self.model; m.optimizer.build(m.trainable_variables) if not m.optimizer.built else None
    vs = [unwrap(v) for v in m.variables] + [unwrap(v) for v in m.optimizer.variables if "learning_rate" not in v.path] \
         + [unwrap(v) for v in m.metrics_variables]
    self.sh = []
    for v in vs:
      with tf.init_scope(), tf.device(v.device):
        self.sh.append(tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False))
    pairs = list(zip(self.sh, vs))
    def copy():
      for s, v in pairs: s.assign(v.read_value(), read_value=False)
    self.snap = tf.function(copy, autograph=False)
    if self.instep:
      orig = m.train_step
      def step(data):
        copy(); return orig(data)
      m.train_step = step; m.make_train_function(force=True)
  def on_train_batch_begin(self, batch, logs=None):
    if not self.instep: self.snap()
n_params = None
class Noop(keras.callbacks.Callback):
  def on_train_batch_begin(self, batch, logs=None): pass
res = {"bare": [], "noop": [], "callback": [], "instep": []}
for r in range(args.reps):
  for name in res:
    m = make()
    cbs = {"bare": [], "noop": [Noop()]}.get(name) or [Snap(instep=(name == "instep"))]
    m.fit(X[:B * 10], Y[:B * 10], batch_size=B, epochs=1, verbose=0, shuffle=False, callbacks=cbs)   # warm
    t = time.perf_counter()
    m.fit(X, Y, batch_size=B, epochs=1, verbose=0, shuffle=False, callbacks=cbs)
    res[name].append((time.perf_counter() - t) / args.batches)
    n_params = m.count_params()
b = np.median(res["bare"])
print("  noop callback %.3f ms/step" % (np.median(res["noop"]) * 1e3))
snap_cb = cbs[0] if name != "bare" else None
m2 = make(); c = Snap(); c.set_model(m2); m2.fit(X[:B], Y[:B], batch_size=B, verbose=0, callbacks=[c])
dt = median_time(c.snap, reps=200)[0]
print("  the snapshot tf.function alone (%d variables): %.3f ms per call" % (len(c.sh), dt * 1e3))
print("%s, %d params, batch %d: ms/step bare %.3f, callback %.3f (x%.3f), in-step %.3f (x%.3f)" % (
    STACK, n_params, B, b * 1e3, np.median(res["callback"]) * 1e3, np.median(res["callback"]) / b,
    np.median(res["instep"]) * 1e3, np.median(res["instep"]) / b))
