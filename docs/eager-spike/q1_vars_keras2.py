"""Q1 (tf-keras on TF 2.21 and Keras 2.15 as tf.keras): model/optimizer
variables, creation time, keys."""
from common import *
assert not K3, "run with ./run.sh tfk or ./run.sh tf215"
layers = keras.layers

keras.utils.set_random_seed(0)
inp = keras.Input((8,))
h = layers.Dense(16, name="d1")(inp)
h = layers.BatchNormalization(name="bn")(h)
h = layers.Dropout(0.5, name="drop")(h)
h = layers.GaussianNoise(0.1, name="noise")(h)
out = layers.Dense(1, name="d2")(h)
model = keras.Model(inp, out, name="m")
print("== model.weights (%d):" % len(model.weights))
for v in model.weights: print("   %-28s %s trainable=%s type=%s" % (v.name, v.dtype.name, v.trainable, type(v).__name__))
print("   model.variables is same list:", [v.name for v in model.variables] == [v.name for v in model.weights])
print("   non_trainable:", [v.name for v in model.non_trainable_variables])
drop = model.get_layer("drop")
print("   Dropout rng:", type(drop._random_generator).__name__, getattr(drop._random_generator, "_rng_type", None),
      "generator var:", getattr(getattr(drop._random_generator, "_generator", None), "state", None))

for cls, kw in [(keras.optimizers.Adam, {}), (keras.optimizers.Adam, dict(use_ema=True)),
                (keras.optimizers.SGD, dict(momentum=0.9))]:
  opt = cls(1e-3, **kw)
  v = opt.variables
  print("== %s(%s): optimizer.variables is %s" % (cls.__name__, kw, "callable" if callable(v) else type(v).__name__))
  vs = v() if callable(v) else v
  print("   before build:", [x.name for x in vs])
  opt.build(model.trainable_variables)
  vs = opt.variables() if callable(opt.variables) else opt.variables
  print("   after build: %d:" % len(vs), [(x.name, type(x).__name__) for x in vs][:9], "...")
  print("   iterations:", type(opt.iterations).__name__, opt.iterations.name, opt.iterations.dtype.name,
        "lr:", type(opt.learning_rate).__name__, getattr(opt, "_learning_rate", None).__class__.__name__)
  print("   iterations in variables:", any(x is opt.iterations for x in vs))

opt2 = keras.optimizers.Adam()
grads = [tf.zeros_like(v) for v in model.trainable_variables]
opt2.apply_gradients(zip(grads, model.trainable_variables))
print("== lazy: after first apply_gradients: n=%d iterations=%d" % (len(opt2.variables), opt2.iterations.numpy()))
lv = keras.optimizers.legacy.Adam()
lv.apply_gradients(zip(grads, model.trainable_variables))
print("   legacy Adam: variables() ->", [x.name for x in lv.variables()][:4], "... n=%d" % len(lv.variables()))

x = np.random.RandomState(0).randn(4, 8).astype("f4")
model.compile(optimizer=keras.optimizers.Adam(), loss="mse", metrics=["mae"])
model.fit(x, x[:, :1], epochs=1, verbose=0)
mv = [v for m in model.metrics for v in m.variables]
print("== metrics variables after fit:", [(v.name, float(v.numpy())) for v in mv])
print("   metrics in model.variables?", any(v is w for v in mv for w in model.variables))
names = [v.name for v in model.variables + model.optimizer.variables]
print("== names unique:", len(names) == len(set(names)))
print("   optimizer var names:", [v.name for v in model.optimizer.variables][:4])
m2 = keras.Sequential([layers.Dense(3, name="d1")]); m2.build((None, 2))
m3 = keras.Sequential([layers.Dense(3, name="d1")]); m3.build((None, 2))
print("   two Sequentials with layer d1:", [v.name for v in m2.weights], [v.name for v in m3.weights])
class Two(layers.Layer):
  def build(self, s):
    self.a = self.add_weight(shape=(2,), name="w"); self.b = self.add_weight(shape=(2,), name="w")
  def call(self, x): return x * self.a * self.b
t = Two(name="two"); t.build((None, 2))
print("   two add_weight(name='w'):", [v.name for v in t.weights])
ck = tf.train.Checkpoint(model=m2)
import tempfile; p = ck.write(tempfile.mkdtemp() + "/c")
print("== tf.train.Checkpoint(model=...) keys:", sorted(k for k, _ in tf.train.list_variables(p)))
