"""Q2/Q6: per-call cost of a traced snapshot vs the number of variables, and a
packed variant (small float32 variables concatenated into one shadow buffer:
one concat + one assign per call), as graph mode's pack=True does.
Usage: run.sh k3 q2_pack.py"""
from common import *
def bench(nvars, size):
  V = [tf.Variable(tf.random.normal([size])) for _ in range(nvars)]
  S = [tf.Variable(tf.zeros([size]), trainable=False) for _ in V]
  P = tf.Variable(tf.zeros([nvars * size]), trainable=False)
  @tf.function(autograph=False)
  def per_var():
    for s, v in zip(S, V): s.assign(v.read_value(), read_value=False)
  @tf.function(autograph=False)
  def packed():
    P.assign(tf.concat([tf.reshape(v.read_value(), [-1]) for v in V], 0), read_value=False)
  @tf.function(autograph=False)
  def unpack():
    parts = tf.split(P.read_value(), [size] * nvars)
    for v, p in zip(V, parts): v.assign(p, read_value=False)
  @tf.function(autograph=False)
  def noop():
    return tf.constant(0)
  for f in (per_var, packed, unpack, noop): f.get_concrete_function()
  r = {n: median_time(f, reps=300, warmup=20)[0] * 1e6 for n, f in
       [("noop fn", noop), ("per-variable", per_var), ("packed", packed), ("unpack (restore)", unpack)]}
  packed(); unpack()
  print("%3d vars x %6d floats: " % (nvars, size) + ", ".join("%s %.0f us" % kv for kv in r.items()))
for n, s in [(1, 256), (21, 300), (64, 256), (64, 16384), (256, 256)]:
  bench(n, s)
