"""Q3: host mode in eager: one traced read of every variable, then numpy.
- does .numpy() copy? does np.asarray(memoryview(t)) alias? writeable?
- are held arrays safe while training continues (in-place updates, Adam, XLA)?
- restore as one traced assign with an input_signature; does the variable
  then alias the numpy array (and would an update write into it)?
- cost vs warm memcpy, model.get_weights()/set_weights()
Usage: run.sh k3 q3_host.py [--rounds 20]
"""
import argparse
from common import *
ap = argparse.ArgumentParser(); ap.add_argument("--rounds", type=int, default=20)
args = ap.parse_args()
N, n = 64, 1 << 20
V = [tf.Variable(np.random.RandomState(i).standard_normal(n).astype(np.float32)) for i in range(N)]

@tf.function(autograph=False)
def read_all():
  return [v.read_value() for v in V]
spec = [tf.TensorSpec(v.shape, v.dtype) for v in V]
@tf.function(input_signature=spec, autograph=False)
def assign_all(*vals):
  for v, x in zip(V, vals):
    v.assign(x, read_value=False)

ts = read_all()
a_copy = ts[0].numpy()
a_view = np.asarray(memoryview(ts[0]))
a_int = ts[0]._numpy()
print("-- aliasing")
print("  t.numpy(): shares memory with tensor buffer:", np.shares_memory(a_copy, a_int), "writeable:", a_copy.flags.writeable)
print("  np.asarray(memoryview(t)): shares with t._numpy():", np.shares_memory(a_view, a_int), "writeable:", a_view.flags.writeable)
print("  t._numpy(): writeable:", a_int.flags.writeable, "aligned to 64 B:", a_int.ctypes.data % 64 == 0)
v0_view = np.asarray(memoryview(V[0].read_value()))
print("  a second read of the variable shares the same buffer (alias of the variable):",
      np.shares_memory(v0_view, a_view))

print("-- are held arrays safe while training continues?")
held_copy = [t.numpy() for t in ts]
held_view = [np.asarray(memoryview(t)) for t in ts]
ref = [h.copy() for h in held_copy]
del ts
@tf.function(autograph=False)
def add_one():
  for v in V: v.assign_add(tf.ones_like(v), read_value=False)
@tf.function(jit_compile=True, autograph=False)
def add_one_xla():
  for v in V: v.assign_add(tf.ones_like(v), read_value=False)
opt = tf.keras.optimizers.SGD(0.1, momentum=0.9) if False else None
add_one(); add_one_xla()
print("  after assign_add + XLA assign_add: .numpy() copies unchanged:",
      all(same_bits(h, r) for h, r in zip(held_copy, ref)),
      "; memoryview aliases unchanged:", all(same_bits(h, r) for h, r in zip(held_view, ref)))
try:
  held_view[0][0] = 1.0
  print("  memoryview alias is writeable (BAD)")
except ValueError as e:
  print("  writing into the memoryview alias:", e)

print("-- restore from held arrays, then update: does the variable write into our array?")
src = [r.copy() for r in ref]
src_ref = [r.copy() for r in ref]
assign_all(*src)
v_view = np.asarray(memoryview(V[0].read_value()))
print("  after assign_all(*arrays): variable buffer shares memory with the numpy array:",
      np.shares_memory(v_view, src[0]))
del v_view
add_one(); add_one_xla()
print("  after 2 updates, source arrays unchanged:", all(same_bits(s, r) for s, r in zip(src, src_ref)),
      "; variable = (src + 1) + 1:", same_bits(V[0].numpy(), (src[0] + np.float32(1)) + np.float32(1)))
al = np.zeros(1 << 20, np.float32)
print("  aligned array (64 B: %s) -> tf.convert_to_tensor shares memory: %s; tf.constant: %s" % (
    al.ctypes.data % 64 == 0, np.shares_memory(np.asarray(memoryview(tf.convert_to_tensor(al))), al),
    np.shares_memory(np.asarray(memoryview(tf.constant(al))), al)))

print("-- dtype/layout corner cases fed to the input_signature function")
W = [tf.Variable(np.zeros((3, 4), np.float32)), tf.Variable(np.float64(0.0)), tf.Variable(np.zeros(5, np.int64))]
@tf.function(input_signature=[tf.TensorSpec(w.shape, w.dtype) for w in W], autograph=False)
def assign_w(a, b, c):
  W[0].assign(a); W[1].assign(b); W[2].assign(c)
cases = {
  "big-endian >f4 / >f8 / >i8": (np.arange(12, dtype=">f4").reshape(3, 4), np.array(2.5, ">f8"), np.arange(5, dtype=">i8")),
  "non-contiguous (transposed, strided)": (np.arange(12, dtype="f4").reshape(4, 3).T, np.array(2.5), np.arange(10, dtype="i8")[::2]),
  "0-d array and numpy scalar": (np.zeros((3, 4), "f4"), np.float64(7.0), np.zeros(5, "i8")),
  "wrong dtype (float64 for float32)": (np.zeros((3, 4), "f8"), np.array(1.0), np.zeros(5, "i8")),
  "wrong shape": (np.zeros((4, 3), "f4"), np.array(1.0), np.zeros(5, "i8")),
}
for name, vals in cases.items():
  try:
    assign_w(*vals)
    ok = all(np.array_equal(w.numpy(), np.asarray(x).astype(w.dtype.as_numpy_dtype)) for w, x in zip(W, vals))
    print("  %-38s accepted, values equal: %s, traces: %d" % (name, ok, assign_w.experimental_get_tracing_count()))
  except Exception as e:
    print("  %-38s %s: %s" % (name, type(e).__name__, str(e).splitlines()[0][:100]))

print("-- timings, 64 vars / 256 MiB, median of %d (ms)" % args.rounds)
pre = [np.empty(n, np.float32) for _ in range(N)]
def snap_numpy():
  return [t.numpy() for t in read_all()]
def snap_prealloc():
  for d, t in zip(pre, read_all()): np.copyto(d, np.asarray(memoryview(t)))
def snap_alias():
  return [np.asarray(memoryview(t)) for t in read_all()]
def snap_eager_loop():
  return [v.numpy() for v in V]
mem_src = [r.copy() for r in ref]
def memcpy():
  for d, s in zip(pre, mem_src): np.copyto(d, s)
def restore_fn():
  assign_all(*src)
def restore_eager_loop():
  for v, s in zip(V, src): v.assign(s)
Z = [tf.zeros_like(v) for v in V]
@tf.function(autograph=False)
def step():
  for v, z in zip(V, Z): v.assign_add(z, read_value=False)
rows = [("warm memcpy (np.copyto, preallocated)", memcpy),
        ("read_all + .numpy() (new arrays)", snap_numpy),
        ("read_all + copyto preallocated", snap_prealloc),
        ("read_all + memoryview alias (no copy)", snap_alias),
        ("eager loop [v.numpy()]", snap_eager_loop),
        ("restore: assign_all(*arrays)", restore_fn),
        ("restore: eager loop v.assign(a)", restore_eager_loop),
        ("restore part: [tf.convert_to_tensor(a)]", lambda: [tf.convert_to_tensor(a) for a in src]),
        ("train step alone (in place)", step),
        ("alias snapshot + step", lambda: (snap_alias(), step())),
        ]
if K3 or True:
  inp = keras.Input((n,)) if False else None
# A Keras model holding the same bytes, for get_weights/set_weights.
class M(keras.layers.Layer):
  def build(self, s):
    self.ws = [self.add_weight(shape=(n,), initializer="zeros", name="w%d" % i) for i in range(N)]
  def call(self, x): return x
m = M(); m.build((1,))
m.set_weights(src)
wts = m.get_weights()
rows += [("model.get_weights()", m.get_weights), ("model.set_weights(arrays)", lambda: m.set_weights(wts))]
res = {name: [] for name, _ in rows}
for r in range(args.rounds):
  for name, f in rows:
    step(); step()   # leave buffers unshared
    a = time.perf_counter(); out = f(); res[name].append(time.perf_counter() - a); del out
base = np.median(res[rows[0][0]])
for name, _ in rows:
  print("  %-40s %8.2f   x memcpy %.2f" % (name, np.median(res[name]) * 1e3, np.median(res[name]) / base))
print("  traces: read_all %d, assign_all %d" % (read_all.experimental_get_tracing_count(), assign_all.experimental_get_tracing_count()))
