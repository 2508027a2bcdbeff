"""Q2 timings, interleaved rounds (the machine is shared): store-style copy
functions vs the hand-written tf.function, 64 vars / 256 MiB float32 on CPU.

Each round runs every variant once in turn; medians over rounds.
  snap      : the call alone (with resource variables the assign aliases: CoW)
  snap+step : the call followed by an in-place update of every variable (what a
              train step does; pays the deferred copy), minus step alone
  deep      : snapshot via tf.raw_ops.DeepCopy (copies at once)
Usage: run.sh k3 q2_timing.py [--rounds 40]
"""
import argparse
from common import *
ap = argparse.ArgumentParser(); ap.add_argument("--rounds", type=int, default=40)
ap.add_argument("--mib", type=int, default=256); ap.add_argument("--nvars", type=int, default=64)
args = ap.parse_args()
N = args.nvars; n_el = args.mib * (1 << 20) // 4 // N
rng = np.random.RandomState(0)
V = [tf.Variable(rng.standard_normal(n_el).astype(np.float32)) for _ in range(N)]
def shadow_set():
  out = []
  for v in V:
    with tf.init_scope(), tf.device(v.device):
      out.append(tf.Variable(tf.zeros_like(v), trainable=False))
  return out
S_hand, S_store = shadow_set(), shadow_set()

@tf.function
def hand_snap():
  for s, v in zip(S_hand, V): s.assign(v)
@tf.function
def hand_rest():
  for s, v in zip(S_hand, V): v.assign(s)
def make(shadows, variables):   # what the store would build, once per slot
  pairs = list(zip(shadows, variables))
  @tf.function(autograph=False)
  def snap():
    for s, v in pairs: s.assign(v.read_value(), read_value=False)
  @tf.function(autograph=False)
  def rest():
    for s, v in pairs: v.assign(s.read_value(), read_value=False)
  return snap, rest
st_snap, st_rest = make(S_store, V)
@tf.function(autograph=False)
def deep_snap():
  for s, v in zip(S_store, V): s.assign(tf.raw_ops.DeepCopy(x=v.read_value()), read_value=False)
Z = [tf.zeros_like(v) for v in V]
@tf.function(autograph=False)
def step():
  for v, z in zip(V, Z): v.assign_add(z, read_value=False)

for f in (hand_snap, hand_rest, st_snap, st_rest, deep_snap, step): f(); f()
def reset():
  # Leave every variable owning its buffer alone (refcount 1): re-snapshot the
  # shadows by deep copy, then one step pays any pending copy.
  deep_snap(); step(); hand_deep()
@tf.function(autograph=False)
def hand_deep():
  for s, v in zip(S_hand, V): s.assign(tf.raw_ops.DeepCopy(x=v.read_value()), read_value=False)
hand_deep()
def t(f):
  reset(); a = time.perf_counter(); f(); return time.perf_counter() - a
def t2(f):
  reset(); a = time.perf_counter(); f(); step(); return time.perf_counter() - a
names = ["hand snap", "store snap", "hand rest", "store rest", "deep snap",
         "step", "hand snap+step", "store snap+step", "hand rest+step", "store rest+step",
         "deep snap+step"]
res = {n: [] for n in names}
for r in range(args.rounds):
  res["hand snap"].append(t(hand_snap)); res["store snap"].append(t(st_snap))
  res["hand rest"].append(t(hand_rest)); res["store rest"].append(t(st_rest))
  res["deep snap"].append(t(deep_snap)); res["step"].append(t(step))
  res["hand snap+step"].append(t2(hand_snap)); res["store snap+step"].append(t2(st_snap))
  res["hand rest+step"].append(t2(hand_rest)); res["store rest+step"].append(t2(st_rest))
  res["deep snap+step"].append(t2(deep_snap))
med = {n: np.median(v) * 1e3 for n, v in res.items()}
print("%d vars, %.0f MiB, %d interleaved rounds; median ms (min ms)" % (N, N * n_el * 4 / 2**20, args.rounds))
for n in names:
  print("  %-16s %8.3f (%8.3f)" % (n, med[n], min(res[n]) * 1e3))
print("ratios store/hand: snap %.3f, restore %.3f, snap+step %.3f, restore+step %.3f" % (
    med["store snap"] / med["hand snap"], med["store rest"] / med["hand rest"],
    med["store snap+step"] / med["hand snap+step"], med["store rest+step"] / med["hand rest+step"]))
print("deferred copy paid by the step: snap+step - step = %.2f ms (hand %.2f)" % (
    med["store snap+step"] - med["step"], med["hand snap+step"] - med["step"]))
src = [v.numpy() for v in V]; dst = [np.empty_like(a) for a in src]
for d, a in zip(dst, src): np.copyto(d, a)
mc = median_time(lambda: [np.copyto(d, a) for d, a in zip(dst, src)], reps=args.rounds)[0]
print("warm numpy memcpy of all: %.2f ms" % (mc * 1e3))
print("tracing counts:", [f.experimental_get_tracing_count() for f in (st_snap, st_rest, deep_snap)])
