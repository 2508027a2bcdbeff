"""Q3: host restore variants for 64 x 4 MiB float32 (one variant per process:
allocator state carries over between variants).
Usage: run.sh k3 q3_restore.py VARIANT [--reps 25]
VARIANT: one_fn | chunk8 | per_var_fn | eager_loop | memcpy
"""
import argparse
from common import *
ap = argparse.ArgumentParser(); ap.add_argument("variant"); ap.add_argument("--reps", type=int, default=25)
args = ap.parse_args()
N, n = 64, 1 << 20
V = [tf.Variable(np.random.RandomState(i).standard_normal(n).astype(np.float32)) for i in range(N)]
src = [np.random.RandomState(100 + i).standard_normal(n).astype(np.float32) for i in range(N)]
def assign_fn(vs):
  @tf.function(input_signature=[tf.TensorSpec(v.shape, v.dtype) for v in vs], autograph=False)
  def f(*xs):
    for v, x in zip(vs, xs): v.assign(x, read_value=False)
  return f
if args.variant == "one_fn":
  f = assign_fn(V); run = lambda: f(*src)
elif args.variant.startswith("chunk"):
  c = int(args.variant[5:]); fs = [(assign_fn(V[i:i + c]), src[i:i + c]) for i in range(0, N, c)]
  run = lambda: [g(*s) for g, s in fs]
elif args.variant == "per_var_fn":
  fs = [(assign_fn([v]), s) for v, s in zip(V, src)]; run = lambda: [g(s) for g, s in fs]
elif args.variant == "eager_loop":
  run = lambda: [v.assign(s) for v, s in zip(V, src)]
elif args.variant == "memcpy":
  dst = [np.empty_like(s) for s in src]; run = lambda: [np.copyto(d, s) for d, s in zip(dst, src)]
Z = [tf.zeros_like(v) for v in V]
@tf.function(autograph=False)
def step():
  for v, z in zip(V, Z): v.assign_add(z, read_value=False)
ts = []
for r in range(args.reps + 2):
  step()
  a = time.perf_counter(); run(); ts.append(time.perf_counter() - a)
ok = all(same_bits(v.numpy(), s) for v, s in zip(V, src)) if args.variant != "memcpy" else True
print("%-11s median %7.2f ms  min %7.2f ms  exact %s" % (args.variant, np.median(ts[2:]) * 1e3, min(ts[2:]) * 1e3, ok))
