"""Q1 (Keras 3, TF backend): which variables a model/optimizer holds, how to
unwrap a KerasVariable, when optimizer state is created, stable keys."""
from common import *
assert K3, "run with ./run.sh k3"
from keras import layers

def desc(v):
  inner = v.value if hasattr(v, "value") else v
  return "%-45s %-8s trainable=%-5s inner=%s" % (
      getattr(v, "path", v.name), v.dtype, v.trainable, type(inner).__name__)

keras.utils.set_random_seed(0)
inp = keras.Input((8,))
h = layers.Dense(16, name="d1")(inp)
h = layers.BatchNormalization(name="bn")(h)
h = layers.Dropout(0.5, name="drop")(h)
h = layers.GaussianNoise(0.1, name="noise")(h)
out = layers.Dense(1, name="d2")(h)
model = keras.Model(inp, out, name="m")

print("== model.weights (%d)" % len(model.weights))
for v in model.weights: print("  ", desc(v))
extra = [v for v in model.variables if all(v is not w for w in model.weights)]
print("== in model.variables but not model.weights (%d)" % len(extra))
for v in extra: print("  ", desc(v), "value", v.numpy())
print("== trainable_variables %d, non_trainable_variables %d" % (
    len(model.trainable_variables), len(model.non_trainable_variables)))
print("   non_trainable_variables:", [v.path for v in model.non_trainable_variables])

# Unwrapping.
kv = model.weights[0]
print("== unwrap: type(kv)=%s, isinstance tf.Variable: %s" % (
    type(kv).__mro__[:3], isinstance(kv, tf.Variable)))
print("   kv.value is", type(kv.value), "; kv._value is kv.value:", kv._value is kv.value)
print("   tf var name=%r device=%r handle shared? %s" % (
    kv.value.name, kv.value.device, kv.handle is kv.value.handle))
print("   tf.Variable trackable? model._tracker holds KerasVariables; "
      "kv.value in tf.train.Checkpoint(model=m) keys below")

# Autocast: under mixed precision, .value inside the autocast scope is a cast tensor.
keras.mixed_precision.set_dtype_policy("mixed_float16")
d = layers.Dense(4, name="mp")
d.build((None, 3))
from keras.src.backend.common.variables import AutocastScope
with AutocastScope("float16"):
  print("== autocast: inside AutocastScope kv.value ->", type(d.kernel.value).__name__,
        d.kernel.value.dtype, "; kv._value ->", type(d.kernel._value).__name__,
        d.kernel._value.dtype)
print("   outside: kv.value ->", type(d.kernel.value).__name__, d.kernel.value.dtype)
captured = {}
class Spy(layers.Layer):
  def build(self, s):
    self.w = self.add_weight(shape=(3, 2), name="w")
  def call(self, x):
    captured["in_call"] = type(self.w.value).__name__ + " " + str(self.w.value.dtype)
    return tf.matmul(x, self.w)
s = Spy(); s(tf.ones((1, 3), tf.float16))
print("   inside a mixed_float16 layer call: w.value ->", captured["in_call"])
keras.mixed_precision.set_dtype_policy("float32")

# Seed generators.
print("== seed generators: drop.seed_generator.state", type(model.get_layer("drop").seed_generator.state.value).__name__,
      model.get_layer("drop").seed_generator.state.numpy())
x = np.random.RandomState(0).randn(4, 8).astype("f4")
drop = model.get_layer("drop")
sv = drop.seed_generator.state.numpy().copy()
a = drop(tf.ones((2, 6)), training=True).numpy()
b = drop(tf.ones((2, 6)), training=True).numpy()
print("   two calls differ:", not np.array_equal(a, b), "state now", drop.seed_generator.state.numpy())
drop.seed_generator.state.assign(sv)
c = drop(tf.ones((2, 6)), training=True).numpy()
print("   after restoring the seed state, mask repeats first call:", np.array_equal(a, c))

# Optimizer variables and when they appear.
for kw in [dict(), dict(use_ema=True)]:
  opt = keras.optimizers.Adam(1e-3, **kw)
  print("== Adam(%s): before build: %s" % (kw, [(v.path, v.dtype) for v in opt.variables]))
  opt.build(model.trainable_variables)
  print("   after build(%d trainables): %d variables" % (len(model.trainable_variables), len(opt.variables)))
  for v in opt.variables: print("     ", v.path, v.shape, v.dtype, type(v.value).__name__)
print("   opt.iterations is a", type(opt.iterations).__name__, "; opt.learning_rate ->", type(opt.learning_rate).__name__)
opt_s = keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5), momentum=0.9)
opt_s.build(model.trainable_variables)
print("   SGD(schedule, momentum): variables", [v.path for v in opt_s.variables])

# Lazily created at first apply?
opt2 = keras.optimizers.Adam()
grads = [tf.zeros_like(v) for v in model.trainable_variables]
print("== lazy build: built=%s n=%d" % (opt2.built, len(opt2.variables)))
opt2.apply_gradients(zip(grads, model.trainable_variables))
print("   after first apply_gradients: built=%s n=%d iterations=%d" % (
    opt2.built, len(opt2.variables), opt2.iterations.numpy()))

# Metric variables after compile + one fit step.
model.compile(optimizer=keras.optimizers.Adam(), loss="mse", metrics=["mae"])
print("== after compile: metrics_variables", [v.path for v in model.metrics_variables],
      "optimizer vars", len(model.optimizer.variables))
model.fit(x, x[:, :1], epochs=1, verbose=0)
print("   after fit: metrics", [m.name for m in model.metrics])
print("   metrics_variables", [(v.path, v.numpy().tolist()) for v in model.metrics_variables])
print("   optimizer vars", len(model.optimizer.variables), "iterations", model.optimizer.iterations.numpy())
print("   model.variables now", len(model.variables), "(metrics in model.variables?",
      any(v is w for v in model.metrics_variables for w in model.variables), ")")

# Keys: path uniqueness, tf names.
paths = [v.path for v in model.variables + model.optimizer.variables + model.metrics_variables]
print("== paths unique:", len(paths) == len(set(paths)), "n=%d" % len(paths))
names = [v.value.name for v in model.variables + model.optimizer.variables]
print("   inner tf.Variable names unique:", len(names) == len(set(names)), names[:4])
# Two models with same layer names.
m2 = keras.Sequential([layers.Dense(3, name="d1")]); m2.build((None, 2))
m3 = keras.Sequential([layers.Dense(3, name="d1")]); m3.build((None, 2))
print("   same layer names in 2 models:", [v.path for v in m2.weights], [v.path for v in m3.weights],
      [v.value.name for v in m2.weights], [v.value.name for v in m3.weights])
# Nested: a model used as a layer in another model.
outer = keras.Sequential([m2, layers.Dense(1, name="head")]); outer.build((None, 2))
print("   nested model paths:", [v.path for v in outer.weights])
# Layer reuse (shared layer): deduplicated?
sh = layers.Dense(2, name="shared")
i2 = keras.Input((2,)); o2 = sh(sh(i2))
mshared = keras.Model(i2, o2)
print("   shared layer: weights", [v.path for v in mshared.weights])
# checkpoint keys
ck = tf.train.Checkpoint(model=m2)
import tempfile; p = ck.write(tempfile.mkdtemp() + "/c")
print("== tf.train.Checkpoint(model=keras3 model) keys:", sorted(k for k, _ in tf.train.list_variables(p)))
