"""Q2: device shadows in eager TF 2: creation (init_scope, colocated, untracked),
one traced function per direction, choosing the slot without retracing, timings
for 64 variables / 256 MiB float32, and copy-on-write behaviour of assign.

Usage: run.sh k3 q2_device.py [--reps 20] [--mib 256] [--nvars 64]
"""
import argparse
from common import *

ap = argparse.ArgumentParser()
ap.add_argument("--reps", type=int, default=20)
ap.add_argument("--mib", type=int, default=256)
ap.add_argument("--nvars", type=int, default=64)
ap.add_argument("--slots", type=int, default=3)
args = ap.parse_args()
N, K = args.nvars, args.slots
n_el = args.mib * (1 << 20) // 4 // N
rng = np.random.RandomState(0)
variables = [tf.Variable(rng.standard_normal(n_el).astype(np.float32), name="v%d" % i)
             for i in range(N)]
print("%d variables x %d floats = %.0f MiB" % (N, n_el, N * n_el * 4 / 2**20))


def make_shadow(v, k):
  # Eager or under init_scope (safe from inside a tf.function), colocated.
  with tf.init_scope(), tf.device(v.device):
    return tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                       name="%s/snap/slot_%d" % (v.name.split(":")[0], k))

# (A) one tf.function per slot and direction, closing over its variables.
shadows = [[make_shadow(v, k) for v in variables] for k in range(K)]

def per_slot_fns(k):
  sh = shadows[k]
  @tf.function(autograph=False)
  def snap():
    for s, v in zip(sh, variables):
      s.assign(v.read_value())
  @tf.function(autograph=False)
  def rest():
    for s, v in zip(sh, variables):
      v.assign(s.read_value())
  return snap, rest
fns = [per_slot_fns(k) for k in range(K)]

# (B) one function per direction, slot index as an argument -> tf.switch_case.
def switch_fn(direction):
  def branch(k):
    def f():
      for s, v in zip(shadows[k], variables):
        (s.assign(v) if direction == "snap" else v.assign(s))
      return tf.constant(0)
    return f
  @tf.function(input_signature=[tf.TensorSpec([], tf.int32)], autograph=False)
  def fn(k):
    return tf.switch_case(k, [branch(i) for i in range(K)])
  return fn
snap_sw, rest_sw = switch_fn("snap"), switch_fn("rest")

# (C) stacked buffers: one [K, n] variable per variable, slot = row.
stacks = []
for v in variables:
  with tf.init_scope(), tf.device(v.device):
    stacks.append(tf.Variable(tf.zeros([K] + v.shape.as_list(), v.dtype), trainable=False))
@tf.function(input_signature=[tf.TensorSpec([], tf.int32)], autograph=False)
def snap_st(k):
  for st, v in zip(stacks, variables):
    st[k].assign(v)
@tf.function(input_signature=[tf.TensorSpec([], tf.int32)], autograph=False)
def rest_st(k):
  for st, v in zip(stacks, variables):
    v.assign(st[k])

# Baseline: the hand-written function a user would write (same as A, slot 0).
base_sh = [make_shadow(v, 99) for v in variables]
@tf.function
def hand_snap():
  for s, v in zip(base_sh, variables):
    s.assign(v)
@tf.function
def hand_rest():
  for s, v in zip(base_sh, variables):
    v.assign(s)

def first_call(f, *a):
  t = time.perf_counter(); f(*a); return time.perf_counter() - t

print("\n-- first call (trace + run), s")
print("  A per-slot snap %.3f rest %.3f (x%d slots)" % (first_call(fns[0][0]), first_call(fns[0][1]), K))
for k in range(1, K): fns[k][0](); fns[k][1]()
print("  B switch_case snap %.3f rest %.3f" % (first_call(snap_sw, tf.constant(0)), first_call(rest_sw, tf.constant(0))))
print("  C stacked     snap %.3f rest %.3f" % (first_call(snap_st, tf.constant(0)), first_call(rest_st, tf.constant(0))))
print("  hand-written  snap %.3f rest %.3f" % (first_call(hand_snap), first_call(hand_rest)))

# Correctness + trace counts across many calls/slots.
for it in range(50):
  k = it % K
  for v in variables[:2]: v.assign_add(tf.ones_like(v))
  want = [v.numpy().copy() for v in variables[:2]]
  fns[k][0](); snap_sw(tf.constant(k)); snap_st(tf.constant(k))
  for v in variables[:2]: v.assign_add(tf.ones_like(v))
  fns[k][1](); assert all(same_bits(v.numpy(), w) for v, w in zip(variables, want))
  for v in variables[:2]: v.assign_add(tf.ones_like(v))
  rest_sw(tf.constant(k)); assert all(same_bits(v.numpy(), w) for v, w in zip(variables, want))
  for v in variables[:2]: v.assign_add(tf.ones_like(v))
  rest_st(tf.constant(k)); assert all(same_bits(v.numpy(), w) for v, w in zip(variables, want))
print("\n-- 50 rounds x 3 slots, all restores bit-exact. tracing counts:")
print("  A", [(f.experimental_get_tracing_count(), g.experimental_get_tracing_count()) for f, g in fns],
      " B", snap_sw.experimental_get_tracing_count(), rest_sw.experimental_get_tracing_count(),
      " C", snap_st.experimental_get_tracing_count(), rest_st.experimental_get_tracing_count())

# Timings. With resource variables, assign aliases the buffer (copy on write):
# the copy is paid by the next write of either side. So we time (a) the call
# alone and (b) call + one in-place update of every variable (what a training
# step does), against the update alone.
zeros = [tf.zeros_like(v) for v in variables]
@tf.function
def touch():
  for v, z in zip(variables, zeros):
    v.assign_add(z)   # in place unless the buffer is shared
touch()
def med(f, *a):
  return median_time(lambda: (f(*a), None)[1], reps=args.reps)[0]
def med_pair(f, *a):
  return median_time(lambda: (f(*a), touch()), reps=args.reps)[0]
k0 = tf.constant(0)
rows = [("hand-written", hand_snap, (), hand_rest, ()),
        ("A per-slot fn", fns[0][0], (), fns[0][1], ()),
        ("B switch_case", snap_sw, (k0,), rest_sw, (k0,)),
        ("C stacked", snap_st, (k0,), rest_st, (k0,))]
t_touch = med(touch)
print("\n-- median of %d reps, ms (256 MiB); touch() alone = %.2f ms" % (args.reps, t_touch * 1e3))
print("  %-14s %9s %9s %16s %16s" % ("", "snap", "restore", "snap+touch-touch", "rest+touch-touch"))
base = None
for name, s, sa, r, ra in rows:
  ts, tr = med(s, *sa), med(r, *ra)
  tst, trt = med_pair(s, *sa) - t_touch, med_pair(r, *ra) - t_touch
  if base is None: base = (ts, tr, tst, trt)
  print("  %-14s %9.3f %9.3f %16.2f %16.2f   ratio vs hand: %.2f %.2f | %.2f %.2f" % (
      name, ts * 1e3, tr * 1e3, tst * 1e3, trt * 1e3, ts / base[0], tr / base[1],
      tst / base[2], trt / base[3]))
# Eager Python loop of assigns, for reference.
def eager_loop():
  for s, v in zip(base_sh, variables): s.assign(v)
print("  eager loop snap %.3f ms" % (med(eager_loop) * 1e3))
src = [v.numpy() for v in variables]; dst = [np.empty_like(a) for a in src]
def memcpy():
  for d, a in zip(dst, src): np.copyto(d, a)
print("  numpy memcpy of 256 MiB (warm): %.2f ms" % (med(memcpy) * 1e3))

# Copy on write check: shadow must not see later updates.
v, s = variables[0], shadows[0][0]
before = v.numpy().copy()
fns[0][0]()
v.assign_add(tf.ones_like(v))
print("\n-- CoW: after snapshot, v.assign_add(1): shadow unchanged:", same_bits(s.numpy(), before),
      "; v changed:", not same_bits(v.numpy(), before))
fns[0][1](); s.assign_add(tf.ones_like(s))
print("   after restore, shadow.assign_add(1): v unchanged:", same_bits(v.numpy(), before))
# Copy-on-read mode (set by ResourceGather/sparse updates): snapshots then copy eagerly.
emb = [tf.Variable(a.copy()) for a in src[:8]]
emb_sh = [make_shadow(e, 0) for e in emb]
@tf.function
def emb_snap():
  for s, e in zip(emb_sh, emb): s.assign(e)
emb_snap()
t_before = med(emb_snap)
for e in emb: tf.gather(e, [0]) if False else e.sparse_read([0])  # ResourceGather
t_after = med(emb_snap)
print("   8 vars (32 MiB): snap %.3f ms before a sparse_read, %.3f ms after (copy-on-read mode)" % (
    t_before * 1e3, t_after * 1e3))
