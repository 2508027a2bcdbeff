"""Q3: does numpy -> tensor conversion alias an aligned array (zero copy)?
And if a variable were assigned such a tensor, would an update write into it?"""
from common import *
def aligned(n, align=64):
  raw = np.empty(n * 4 + align, np.uint8)
  off = (-raw.ctypes.data) % align
  return raw[off:off + n * 4].view(np.float32)
a = aligned(1 << 20); a[:] = 1.0
print("aligned:", a.ctypes.data % 64 == 0)
for name, f in [("tf.convert_to_tensor", tf.convert_to_tensor), ("tf.constant", tf.constant),
                ("tf.identity", tf.identity)]:
  t = f(a)
  print("  %-22s shares memory with the array: %s" % (name, np.shares_memory(np.asarray(memoryview(t)), a)))
v = tf.Variable(tf.zeros_like(a))
@tf.function(input_signature=[tf.TensorSpec(a.shape, tf.float32)])
def put(x): v.assign(x)
put(a)
print("  variable after put(a) shares the array:", np.shares_memory(np.asarray(memoryview(v.read_value())), a))
v.assign_add(tf.ones_like(v))
print("  array unchanged after v.assign_add:", bool((a == 1.0).all()))
t0 = time.perf_counter()
for _ in range(20): tf.convert_to_tensor(a)
print("  convert_to_tensor 4 MiB: %.2f ms per call" % ((time.perf_counter() - t0) / 20 * 1e3))
