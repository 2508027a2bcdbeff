"""Q2: shadows made under tf.init_scope (also when the store is built from
inside a tf.function) are not tracked: model.weights and checkpoint keys are
unchanged even when the store object is set as a model/module attribute."""
from common import *
import tempfile

class Store:   # a plain Python object, like SnapshotStore (not Trackable)
  def __init__(self, variables):
    self.vars = list(variables); self.shadows = []
    for v in self.vars:
      with tf.init_scope(), tf.device(v.device):
        self.shadows.append(tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False))

if K3:
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  tvars = [w.value for w in model.weights]
else:
  model = keras.Sequential([keras.layers.Dense(2, input_shape=(3,))])
  tvars = model.weights
def keys(obj):
  p = tf.train.Checkpoint(m=obj).write(tempfile.mkdtemp() + "/c")
  return sorted(k for k, _ in tf.train.list_variables(p))
k0, w0 = keys(model), len(model.weights)
model.store = Store(tvars)
print("Keras model: weights %d -> %d, variables %d, checkpoint keys unchanged: %s" % (
    w0, len(model.weights), len(model.variables), keys(model) == k0))
mod = tf.Module(); mod.w = tf.Variable(tf.ones([2]))
km = keys(mod); mod.store = Store(mod.variables)
print("tf.Module: variables %d, checkpoint keys unchanged: %s" % (len(mod.variables), keys(mod) == km))

# Built from inside a tf.function: init_scope lifts the creation out of the trace.
holder = {}
@tf.function
def train_step():
  if "s" not in holder:
    holder["s"] = Store(tvars)
  return tf.add_n([tf.reduce_sum(s) for s in holder["s"].shadows])
train_step(); train_step()
s0 = holder["s"].shadows[0]
print("store built inside tf.function: shadow is eager variable:", hasattr(s0, "numpy"),
      "device", s0.device, "traces", train_step.experimental_get_tracing_count())
# Without init_scope: tf.Variable in a tf.function on a later trace is an error.
@tf.function
def bad(x):
  return tf.Variable(x)
try:
  bad(tf.constant(1.0)); bad(tf.constant([1.0, 2.0]))
  print("creating a variable on a second trace: no error")
except ValueError as e:
  print("creating a variable on a second trace:", str(e).splitlines()[0][:110])
