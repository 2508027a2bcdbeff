"""Q8: what tells graph mode from eager when a store is built, and how to tell
a FuncGraph (tf.function trace) from a TF1 graph; variable kinds."""
from common import *
from tensorflow.python.framework import ops

def where(label):
  g = ops.get_default_graph()
  print("  %-44s executing_eagerly=%-5s inside_function=%-5s building_function=%-5s graph=%s" % (
      label, tf.executing_eagerly(), tf.inside_function(), getattr(g, "building_function", None),
      type(g).__name__))
print("contexts:")
where("top level (TF2 default)")
@tf.function
def f():
  where("inside tf.function trace")
  with tf.init_scope():
    where("  init_scope inside the trace")
  return 0
f()
with tf.Graph().as_default():
  where("with tf.Graph().as_default()")
  with tf.init_scope():
    where("  init_scope inside a TF1 graph")
  @tf.function
  def g():
    where("tf.function traced inside a TF1 graph")
    with tf.init_scope(): where("  its init_scope")
    return 0
  g()
wf = tf.compat.v1.wrap_function(lambda: where("tf.compat.v1.wrap_function") or tf.constant(0), [])
if K3:
  from keras.src import backend as kb
  d = keras.layers.Dense(2)
  class Probe(keras.layers.Layer):
    def call(self, x):
      where("Keras 3 symbolic call (compute_output_spec)"); return x
  Probe()(keras.KerasTensor((None, 3)))

print("variables:")
ev = tf.Variable(1.0)
print("  eager variable: type %s, hasattr graph: %s, _in_graph_mode=%s" % (
    type(ev).__name__, hasattr(ev, "graph"), getattr(ev, "_in_graph_mode", None)))
holder = []
@tf.function
def make_in_fn():
  if not holder: holder.append(tf.Variable(2.0, name="made_in_fn"))
  return holder[0].read_value()
make_in_fn()
fv = holder[0]
print("  variable created in a tf.function (first trace): type %s, _in_graph_mode=%s, numpy()=%s, traces=%d" % (
    type(fv).__name__, getattr(fv, "_in_graph_mode", None), fv.numpy(), make_in_fn.experimental_get_tracing_count()))
with tf.Graph().as_default() as gr:
  gv = tf.compat.v1.get_variable("g", [], use_resource=True)
  rv = tf.compat.v1.Variable(1.0, use_resource=False)
  print("  TF1-graph variables: %s _in_graph_mode=%s graph is gr: %s; %s" % (
      type(gv).__name__, gv._in_graph_mode, gv.graph is gr, type(rv).__name__))
try:
  with tf.Graph().as_default():
    tf.identity(ev)
  print("  using an eager variable in a TF1 graph: no error")
except Exception as e:
  print("  using an eager variable in a TF1 graph: %s: %s" % (type(e).__name__, str(e).splitlines()[0][:100]))
# disable_v2_behavior after eager ops ran
try:
  tf.compat.v1.disable_eager_execution()
  where("after disable_eager_execution() late")
except Exception as e:
  print("  disable_eager_execution after eager ops: %s: %s" % (type(e).__name__, str(e)[:120]))
