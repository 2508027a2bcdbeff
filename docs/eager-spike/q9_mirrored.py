"""Q9 (preview of issue 24): MirroredStrategy on 2 logical CPUs. How per-replica
shadows are made (as TF makes slots), how each component is copied on its own
device, sync-on-read variables, an in-step copy from replica context."""
from common import *
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
  v = tf.Variable(np.arange(4, dtype=np.float32), name="w")
  sor = tf.Variable(0.0, synchronization=tf.VariableSynchronization.ON_READ,
                    aggregation=tf.VariableAggregation.SUM, name="count")
print("v: %s, components: %s" % (type(v).__name__, [(type(c).__name__, c.device[-5:]) for c in v.values]))
print("sync-on-read: %s, components: %s" % (type(sor).__name__, [c.device[-5:] for c in sor.values]))
print("created in scope:", strategy.extended.variable_created_in_scope(v))

# Shadows as slot_creator makes them: colocate_vars_with(primary) inside the scope.
with strategy.scope(), strategy.extended.colocate_vars_with(v):
  s = tf.Variable(tf.zeros_like(v.values[0]), trainable=False, name="w_shadow")
print("shadow: %s, components: %s" % (type(s).__name__, [c.device[-5:] for c in s.values]))
with strategy.scope(), strategy.extended.colocate_vars_with(sor):
  s_sor = tf.Variable(tf.zeros([]), trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                      aggregation=tf.VariableAggregation.SUM)
print("shadow of sync-on-read: %s" % type(s_sor).__name__)

# Make replica components differ (as sync-on-read ones do), then copy per component.
v.values[1].assign(v.values[1] + 100.0)
sor.values[0].assign(3.0); sor.values[1].assign(4.0)
print("sync-on-read read in cross-replica context:", sor.numpy() if hasattr(sor, "numpy") else sor.read_value().numpy(),
      "components", [c.numpy() for c in sor.values])

@tf.function(autograph=False)
def snap_update():          # cross-replica: extended.update runs fn per component on its device
  strategy.extended.update(s, lambda a, b: a.assign(b), args=(v,))
@tf.function(autograph=False)
def snap_components():      # or: pair the components by device and assign directly
  for a, b in zip(s.values, v.values):
    with tf.device(a.device):
      a.assign(b.read_value())
  for a, b in zip(s_sor.values, sor.values):
    with tf.device(a.device):
      a.assign(b.read_value())
snap_update()
print("extended.update copy: shadow components", [c.numpy().tolist() for c in s.values],
      "(v components", [c.numpy().tolist() for c in v.values], ")")
s.values[0].assign(tf.zeros(4)); s.values[1].assign(tf.zeros(4))
snap_components()
print("per-component copy: shadow", [c.numpy().tolist() for c in s.values], "sor shadow", [c.numpy() for c in s_sor.values])
g = snap_components.get_concrete_function().graph
print("devices of the copy ops:", sorted({op.device[-5:] for op in g.get_operations() if op.type in ("AssignVariableOp", "ReadVariableOp")}))

# In-step: a copy inside strategy.run (replica context).
@tf.function(autograph=False)
def step():
  def replica_fn():
    s.assign(v.read_value())          # local component in replica context?
    return tf.constant(0)
  return strategy.run(replica_fn)
try:
  v.values[0].assign([1., 2., 3., 4.]); v.values[1].assign([5., 6., 7., 8.])
  step()
  print("replica-context s.assign(v): shadow components", [c.numpy().tolist() for c in s.values])
except Exception as e:
  print("replica-context s.assign(v):", type(e).__name__, str(e).splitlines()[0][:150])
if K3:
  with strategy.scope():
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  print("Keras 3 under MirroredStrategy: weight.value is", type(m.weights[0].value).__name__)
