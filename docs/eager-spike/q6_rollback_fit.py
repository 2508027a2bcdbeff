"""Q6 key experiment: fit on fixed data (shuffle=False) where batch K gives a
NaN loss; roll it back; compare bit for bit with training without batch K.

Modes (--mode):
  callback : snapshot (device shadows, traced copy) in on_train_batch_begin,
             restore in on_train_batch_end when logs["loss"] is not finite
             (metrics restored too, so the running mean stays finite)
  instep   : the callback wraps model.train_step (copy at the start of the step,
             restore inside the step when the loss tracker's total is not finite)
             and re-makes the train function; works with steps_per_execution > 1
--cover: comma list of what is restored: weights (model.weights), seeds
  (seed-generator state, Keras 3), opt (optimizer variables minus the Keras 3
  learning rate), iters (optimizer iterations), metrics (metrics variables)
Runs on k3 (Keras 3) and tfk / tf215 (Keras 2: no seed variables; the in-step
mode is Keras 3 only here).
"""
import argparse
from common import *
ap = argparse.ArgumentParser()
ap.add_argument("--mode", default="callback")
ap.add_argument("--cover", default="weights,seeds,opt,iters,metrics")
ap.add_argument("--dropout", type=float, default=0.0)
ap.add_argument("--spe", type=int, default=1, help="steps_per_execution")
ap.add_argument("--jit", default="false")
ap.add_argument("--epochs", type=int, default=2)
ap.add_argument("--bad", type=int, default=3)
ap.add_argument("--quiet", action="store_true")
ap.add_argument("--clean-same-program", action="store_true",
                help="train the clean model with the same callback (same compiled step)")
ap.add_argument("--tf-generator", action="store_true",
                help="Keras 2: enable_tf_random_generator() and seed Dropout")
args = ap.parse_args()
if args.tf_generator:
  keras.backend.experimental.enable_tf_random_generator()
cover = set(args.cover.split(","))
B, NB = 16, 8
rng = np.random.RandomState(0)
X = rng.randn(B * NB, 6).astype("f4"); Y = np.tanh(X @ rng.randn(6, 1)).astype("f4")
Xbad = X.copy(); Xbad[args.bad * B, 0] = np.nan
keep = np.r_[0:args.bad * B, (args.bad + 1) * B:B * NB]

def unwrap(v): return v.value if K3 else v
def opt_vars(o): return list(o.variables() if callable(o.variables) else o.variables)

def make_model():
  keras.utils.set_random_seed(42)
  L = keras.layers
  lay = [L.Dense(16, activation="relu"), L.BatchNormalization()]
  if args.dropout: lay.append(L.Dropout(args.dropout, seed=7 if args.tf_generator else None))
  lay.append(L.Dense(1))
  if K3:
    m = keras.Sequential([keras.Input((6,))] + lay)
  else:
    m = keras.Sequential(lay); m.build((None, 6))
  kw = dict(jit_compile=args.jit == "true")
  if args.spe > 1: kw["steps_per_execution"] = args.spe
  m.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"], **kw)
  return m

def state(m):
  """name -> list of tf.Variables, for comparison."""
  o = m.optimizer
  if K3:
    seeds = [v for v in m.variables if "seed_generator_state" in getattr(v, "path", "")]
  else:   # tf-keras: a tf.random.Generator's state, only with enable_tf_random_generator()
    seeds = [l._random_generator._generator.state for l in m.layers
             if getattr(getattr(l, "_random_generator", None), "_generator", None) is not None]
  ovars = opt_vars(o)
  return {
    "weights": [unwrap(v) for v in m.weights],
    "seeds": [unwrap(v) for v in seeds],
    "opt": [unwrap(v) for v in ovars if v is not o.iterations and "learning_rate" not in v.name],
    "iters": [unwrap(o.iterations)],
    "metrics": [unwrap(v) for mm in m.metrics for v in mm.variables],
  }

class Snap:
  """Device shadows + one traced function per direction (what the store does)."""
  def __init__(self, variables):
    self.vars = variables; self.sh = []
    for v in variables:
      with tf.init_scope(), tf.device(v.device):
        self.sh.append(tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False))
    pairs = list(zip(self.sh, self.vars))
    def copy_in():
      for s, v in pairs: s.assign(v.read_value(), read_value=False)
    def copy_out():
      for s, v in pairs: v.assign(s.read_value(), read_value=False)
    self.copy_in, self.copy_out = copy_in, copy_out   # for use inside a step
    self.snapshot = tf.function(copy_in, autograph=False)
    self.restore = tf.function(copy_out, autograph=False)

class RollbackCallback(keras.callbacks.Callback):
  def __init__(self): super().__init__(); self.rollbacks = 0; self.rebuilds = 0
  def covered(self):
    st = state(self.model)
    return [v for k in sorted(cover) for v in st[k]]
  def on_train_begin(self, logs=None):
    o = self.model.optimizer
    # Keras 3 (TF backend, no strategy) and tf-keras build the optimizer on the
    # first trace of the train function: build it now, as Keras 3's own
    # _symbolic_build would (same variables, same order).
    print("  on_train_begin: optimizer built=%s, %d variables, %d metric variables" % (
        getattr(o, "built", getattr(o, "_built", None)), len(opt_vars(o)),
        sum(len(m.variables) for m in self.model.metrics)))
    if args.mode == "instep" and K3:
      # The step's copy is traced once, so everything must exist now: Keras 3's
      # own (private) symbolic build makes compile metrics, loss and optimizer
      # state without running anything (what fit does under a strategy).
      self.model._symbolic_build(data_batch=(X[:1], Y[:1]))
    if not getattr(o, "built", getattr(o, "_built", False)):
      o.build(self.model.trainable_variables)
    self.snap = Snap(self.covered())
    if args.mode == "instep":
      m = self.model; orig = m.train_step; snap = self.snap
      self.counter = tf.Variable(0, trainable=False)
      total = unwrap(m.metrics[0].variables[0])   # loss tracker total (running sum)
      counter = self.counter
      def train_step(data):
        snap.copy_in()
        logs = orig(data)
        def undo():
          snap.copy_out(); counter.assign_add(1); return tf.constant(True)
        tf.cond(tf.math.is_finite(total.read_value()), lambda: tf.constant(False), undo)
        return logs
      m.train_step = train_step
      m.make_train_function(force=True)
  def on_train_batch_begin(self, batch, logs=None):
    if args.mode == "callback":
      cov = self.covered()
      if len(cov) != len(self.snap.vars):   # compile metrics appear after the first step
        self.snap = Snap(cov); self.rebuilds += 1
      self.snap.snapshot()
  def on_train_batch_end(self, batch, logs=None):
    if args.mode == "callback" and not np.isfinite(logs["loss"]):
      self.snap.restore(); self.rollbacks += 1
      if "metrics" in cover:   # metrics created during this step: reset = their state before it
        known = {id(v) for v in self.snap.vars}
        for m in self.model.metrics:
          if any(id(unwrap(v)) not in known for v in m.variables): m.reset_state()
  def on_train_end(self, logs=None):
    if args.mode == "instep": self.rollbacks = int(self.counter.numpy())

clean = make_model()
hc = clean.fit(X[keep], Y[keep], batch_size=B, epochs=args.epochs, shuffle=False, verbose=0,
               callbacks=[RollbackCallback()] if args.clean_same_program else [])
rb = make_model()
cb = RollbackCallback()
hr = rb.fit(Xbad, Y, batch_size=B, epochs=args.epochs, shuffle=False, verbose=0, callbacks=[cb])
sc, sr = state(clean), state(rb)
print("[%s] mode=%s cover=%s dropout=%s spe=%d jit=%s rollbacks=%d store rebuilds=%d traces=%s" % (
    STACK, args.mode, args.cover, args.dropout, args.spe, args.jit, cb.rollbacks, cb.rebuilds,
    (cb.snap.snapshot.experimental_get_tracing_count(), cb.snap.restore.experimental_get_tracing_count())))
for k in ["weights", "seeds", "opt", "iters", "metrics"]:
  a, b = sc[k], sr[k]
  if not a: continue
  eq = [same_bits(x.numpy(), y.numpy()) for x, y in zip(a, b)]
  print("  %-8s bit-identical: %2d/%2d %s" % (k, sum(eq), len(eq), "" if all(eq) else
        str([getattr(v, "name", "") for v, e in zip(a, eq) if not e]) + " " +
        "max|diff| %.3g" % max(float(np.nanmax(np.abs(x.numpy().astype("f8") - y.numpy().astype("f8")))) for x, y in zip(a, b))))
print("  epoch losses clean %s\n  epoch losses rollb %s" % (hc.history["loss"], hr.history["loss"]))
