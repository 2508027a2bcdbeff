"""Q7: read a TF2 object-based checkpoint into arrays keyed like the live
model's variables, without building anything and without touching the live
variables: walk the checkpoint's object graph (proto) and the live object graph
(tf.train.TrackableView.children) side by side, by child name, as restore does.
Also lists Keras 3's .weights.h5 layout."""
import tempfile, os
from common import *
from tensorflow.core.protobuf import trackable_object_graph_pb2
L = keras.layers

def make():
  keras.utils.set_random_seed(0)
  if K3:
    m = keras.Sequential([keras.Input((4,)), L.Dense(3, name="d1"), L.BatchNormalization(name="bn"), L.Dense(1, name="d2")])
  else:
    m = keras.Sequential([L.Dense(3, name="d1"), L.BatchNormalization(name="bn"), L.Dense(1, name="d2")]); m.build((None, 4))
  m.compile(optimizer=keras.optimizers.Adam(0.1), loss="mse")
  return m
m = make()
x = np.random.RandomState(0).randn(8, 4).astype("f4")
m.fit(x, x[:, :1], epochs=1, verbose=0)
d = tempfile.mkdtemp()
path = tf.train.Checkpoint(model=m, optimizer=m.optimizer).write(os.path.join(d, "ckpt"))
reader = tf.train.load_checkpoint(path)
shapes = reader.get_variable_to_shape_map()
print("checkpoint keys (%d):" % len(shapes))
for k in sorted(shapes): print("   ", k, shapes[k])

graph = trackable_object_graph_pb2.TrackableObjectGraph()
graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
def unwrap(v): return v.value if K3 and not isinstance(v, tf.Variable) else v

def map_keys(root, graph):
  """live tf.Variable -> checkpoint key, walking both graphs from node 0."""
  out = {}; seen = set()
  def walk(obj, node_id):
    if node_id in seen: return
    seen.add(node_id)
    node = graph.nodes[node_id]
    for attr in node.attributes:
      if attr.name == "VARIABLE_VALUE":
        out[attr.checkpoint_key] = obj
    children = tf.train.TrackableView.children(obj)
    for ref in node.children:
      if ref.local_name in children:
        walk(children[ref.local_name], ref.node_id)
    # optimizer slots (tf-keras): node.slot_variables on the optimizer node
    for sv in node.slot_variables:
      pass
  root_obj = tf.train.Checkpoint(model=m, optimizer=m.optimizer)   # same root as when writing
  walk(root_obj, 0)
  return out
mapping = map_keys(m, graph)
ok = 0
for key, obj in sorted(mapping.items()):
  v = unwrap(obj)
  equal = same_bits(reader.get_tensor(key), v.numpy())
  ok += equal
print("\nmapped %d of %d variable keys by object graph walk; all values equal to the live variable: %s" % (
    len(mapping), len(shapes) - 1, ok == len(mapping)))
live = [unwrap(v) for v in m.variables] + [unwrap(v) for v in (m.optimizer.variables() if callable(m.optimizer.variables) else m.optimizer.variables)]
ids = {id(unwrap(o)) for o in mapping.values()}
print("live model+optimizer variables not found in the checkpoint:", [v.name for v in live if id(v) not in ids])
unm = [k for k in shapes if k not in mapping and k != "_CHECKPOINTABLE_OBJECT_GRAPH"]
print("checkpoint keys not mapped:", unm)
# slot variables recorded as slot_variables (tf-keras / TF optimizers)
nslots = sum(len(n.slot_variables) for n in graph.nodes)
print("object-graph nodes: %d, slot_variables entries: %d" % (len(graph.nodes), nslots))

# Is the live model untouched? Perturb the checkpoint values' source and compare.
before = [v.numpy().copy() for v in live]
_ = map_keys(m, graph)
print("live variables unchanged by the mapping:", all(same_bits(v.numpy(), b) for v, b in zip(live, before)))

if K3:
  import h5py
  p = os.path.join(d, "m.weights.h5"); m.save_weights(p)
  print("\nKeras 3 .weights.h5 datasets:")
  with h5py.File(p, "r") as f:
    f.visititems(lambda n, o: print("   ", n, o.shape, o.dtype) if isinstance(o, h5py.Dataset) else None)
  print("  model.weights order:", [w.path for w in m.weights])
