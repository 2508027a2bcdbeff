"""Q2: does shadow.assign(var) copy or alias (copy on write)? Who pays the copy?
Measures, for 64 x 4 MiB float32 resource variables:
  step alone (in place), snapshot alone, step right after a snapshot."""
from common import *
N, n = 64, 1 << 20
V = [tf.Variable(np.random.RandomState(i).standard_normal(n).astype(np.float32)) for i in range(N)]
S = [tf.Variable(tf.zeros_like(v), trainable=False) for v in V]
Z = [tf.zeros_like(v) for v in V]
@tf.function(autograph=False)
def snap():
  for s, v in zip(S, V): s.assign(v, read_value=False)
@tf.function(autograph=False)
def step():
  for v, z in zip(V, Z): v.assign_add(z, read_value=False)
@tf.function(autograph=False)
def step_mul():        # an update that is not an AssignAdd: v.assign(v * 1.0)
  for v in V: v.assign(v * 1.0, read_value=False)
snap(); step(); step_mul()
def timeit(f, reps=25):
  ts = []
  for _ in range(reps):
    a = time.perf_counter(); f(); ts.append(time.perf_counter() - a)
  return np.median(ts) * 1e3
def snap_then_step():
  snap(); a = time.perf_counter(); step(); return time.perf_counter() - a
def snap_then_mul():
  snap(); a = time.perf_counter(); step_mul(); return time.perf_counter() - a
for _ in range(2):
  print("step alone (in place)         %7.2f ms" % timeit(step))
  print("snapshot alone                %7.2f ms" % timeit(snap))
  print("step right after a snapshot   %7.2f ms" % (np.median([snap_then_step() for _ in range(25)]) * 1e3))
  print("v.assign(v*1) alone           %7.2f ms" % timeit(step_mul))
  print("v.assign(v*1) after snapshot  %7.2f ms" % (np.median([snap_then_mul() for _ in range(25)]) * 1e3))
src = [v.numpy() for v in V]; dst = [np.empty_like(a) for a in src]
print("numpy memcpy (warm)           %7.2f ms" % timeit(lambda: [np.copyto(d, a) for d, a in zip(dst, src)]))
print("numpy a += 0 in place         %7.2f ms" % timeit(lambda: [np.add(d, 0.0, out=d) for d in dst]))
snap(); before = [s.numpy().copy() for s in S[:3]]
step_inc = tf.function(lambda: [v.assign_add(tf.ones_like(v)) for v in V[:3]])
step_inc()
print("shadow unchanged after the variable's update:", all(same_bits(s.numpy(), b) for s, b in zip(S, before)))
def view(v): return np.asarray(memoryview(v.read_value()))   # zero-copy view
snap()
print("variable and shadow share one buffer right after the snapshot:", np.shares_memory(view(V[0]), view(S[0])))
step()
print("... and after the variable's next update:", np.shares_memory(view(V[0]), view(S[0])))
