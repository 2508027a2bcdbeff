"""A child process measuring a store's peak memory (tests/contract/memory.py,
bench/bench_memory.py).

    python tests/memory_child.py ENGINE MODE [--mib 256] [--vars 8]
        [--max-to-keep 2] [--dir DIR] [--paths arrays,...] [--time ROUNDS]

ENGINE is "graph" (tf.compat.v1 with v2 behaviour off) or "eager". The
model is `--vars` float32 variables of `--mib` MiB in all, filled one
variable at a time by a TensorFlow random op (a transient of one variable).
RSS is read from /proc/self/statm, the peak from /proc/self/status (VmHWM:
what `ru_maxrss` reports, without the forking parent's peak, see `peak`),
reset by writing 5 to /proc/self/clear_refs where the kernel allows it (then
each part below has a peak of its own).

Parts (`--paths`, in this order, each after the ones before it):

  core        the model exists (its RSS is the base); the store is built;
              two snapshots with the variables changed before each, the
              variables changed again, the first snapshot restored. Peak
              RSS minus the base over the bytes the mode must hold
              (`HELD`), then the restore checked bit for bit (SHA-256 of
              every variable's bytes, as numpy sees them, against the values
              snapshotted).
  arrays      `store.arrays(tag)` of both snapshots, kept by the caller
  load_arrays those arrays given back with `load_arrays` (replacing tag 1)
  npz         `files.save_npz`, then `files.load_npz` of the archive
              (tag 1 deleted first: a snapshot that replaces a held one
              exists in full before the old one goes)
  evaluate    `evaluate_with` of a function reading one variable
  ring        host: a snapshot over held tag 2 (a full ring's next one)
  load_spill  disk: the store closed (its file then holds both
              snapshots), `files.load_spill` of snapshot 1 into a host store

With `--time`, after the parts: medians of a warm memcpy of the model's
bytes, then of a snapshot over a held tag and a restore (bench/bench_memory.py).

Each part other than core reports its transient: peak minus the larger of
its RSS before and after (what it keeps, e.g. arrays a caller holds, is
not transient), in models. The output is one JSON line.
"""

import argparse
import hashlib
import json
import os
import resource
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

MIB = 1 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss():
  """This process's resident set, in bytes."""
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * _PAGE


def peak():
  """The peak resident set since start or the last `reset_peak`, in bytes.

  VmHWM of /proc/self/status, this process's own high-water mark. On Linux
  `ru_maxrss` (`resource.getrusage`, KiB) is the same number but never below
  the high-water mark of the memory this process was forked with: a child of
  a pytest process of 2.7 GiB reported 2.7 GiB however little it used.
  Where /proc is missing, `ru_maxrss` it is.
  """
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak():
  """Resets the peak to the current RSS; False where the kernel refuses."""
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    return True
  except OSError:
    return False


def held_models(engine, mode, max_to_keep):
  """The models' worth of bytes the mode must hold in the core part: host
  keeps `max_to_keep` snapshots, device as many slots; disk
  (memory_budget=1) the one kept in memory and the one on its way to the
  file. (No part but evaluate swaps, so no scratch copy is due.)"""
  del engine  # the same in both
  if mode == "disk":
    return 2
  return max_to_keep


class Model(object):
  """The variables, how to change them and how to hash them, per engine."""

  def __init__(self, engine, mib, count):
    from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

    self.engine = engine
    self.tf = tf
    per = int(mib * MIB) // count // 4
    self.shape = [max(1, per // 1024), 1024]
    self.nbytes = count * self.shape[0] * self.shape[1] * 4
    if engine == "graph":
      self.graph = tf.Graph()
      with self.graph.as_default():
        self.seed = tf.placeholder(tf.int64, [2])
        self.variables = []
        self.fills = []
        self.reads = []
        for i in range(count):
          v = tf.get_variable(
            "v%d" % i,
            self.shape,
            tf.float32,
            initializer=tf.zeros_initializer(),
            use_resource=True,
          )
          self.variables.append(v)
          value = _uniform(tf, self.shape, self.seed)
          self.fills.append(v.assign(value, read_value=False))
          self.reads.append(v.read_value())
        init = tf.global_variables_initializer()
      self.sess = tf.Session(graph=self.graph)
      for v in self.variables:
        self.sess.run(v.initializer)
      del init
    else:
      tf2 = tf.compat.v2
      self.variables = []
      for i in range(count):
        self.variables.append(
          tf2.Variable(tf2.zeros(self.shape, tf2.float32), name="v%d" % i)
        )
      self.sess = None

  def store(self, mode, max_to_keep, directory):
    import snapstore  # pylint: disable=g-import-not-at-top

    options = {}
    if mode == "disk":
      options = dict(
        spill_path=os.path.join(directory, "spill.h5"), memory_budget=1
      )
    if self.engine == "graph":
      with self.graph.as_default():
        return snapstore.SnapshotStore(
          var_list=self.variables, mode=mode, max_to_keep=max_to_keep, **options
        )
    return snapstore.SnapshotStore(
      var_list=self.variables, mode=mode, max_to_keep=max_to_keep, **options
    )

  @property
  def session(self):
    return {"session": self.sess} if self.sess is not None else {}

  def fill(self, version):
    """New values in every variable, one variable at a time."""
    tf = self.tf
    for i, v in enumerate(self.variables):
      seed = [version, i]
      if self.engine == "graph":
        self.sess.run(self.fills[i], {self.seed: seed})
      else:
        v.assign(_uniform(tf, self.shape, seed), read_value=False)

  def hashes(self):
    """SHA-256 of each variable's bytes (one variable read at a time)."""
    out = []
    for i, v in enumerate(self.variables):
      if self.engine == "graph":
        value = self.sess.run(self.reads[i])
        out.append(hashlib.sha256(memoryview(value).cast("B")).hexdigest())
      else:
        # A view of TensorFlow's buffer: no copy.
        value = self.tf.raw_ops.ReadVariableOp(resource=v.handle, dtype=v.dtype)
        out.append(hashlib.sha256(memoryview(value).cast("B")).hexdigest())
      del value
    return out


def _uniform(tf, shape, seed):
  """One op's tensor of uniform floats in [0, 1) (`tf.random.stateless_uniform`
  scales and shifts its op's output: eagerly two more tensors of the
  variable's size, which glibc's malloc hands back but a pool would keep)."""
  return tf.raw_ops.StatelessRandomUniform(
    shape=shape, seed=tf.cast(seed, tf.int64), dtype=tf.float32
  )


def _timed(times, name, fn):
  start = time.perf_counter()
  out = fn()
  times[name] = time.perf_counter() - start
  return out


def _time_calls(store, sess, rounds):
  """Medians over `rounds` of a warm memcpy of the model's bytes (np.copyto
  of snapshot 1's arrays into preallocated ones), then of a snapshot (over a
  held tag) and a restore, interleaved. The memcpy's two models are freed
  before the store's calls run: beside the store's own they would not fit
  a 4 GiB model on a 24 GiB machine."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  def medians(calls):
    times = dict((name, []) for name in calls)
    for name, fn in calls.items():
      fn()  # warm: pages touched, functions run once
    for _ in range(rounds):
      for name, fn in calls.items():  # interleaved, so drift hits each alike
        start = time.perf_counter()
        fn()
        times[name].append(time.perf_counter() - start)
    return dict((name, sorted(t)[len(t) // 2]) for name, t in times.items())

  def memcpy():  # its arrays go when it returns
    source = list(store.arrays(1, **sess).values())
    target = [np.empty_like(a) for a in source]
    return medians(
      {"memcpy_warm": lambda: [np.copyto(t, a) for t, a in zip(target, source)]}
    )

  out = memcpy()
  out.update(
    medians(
      {
        "snapshot_warm": lambda: store.snapshot(2, **sess),
        "restore_warm": lambda: store.restore(1, **sess),
      }
    )
  )
  return out


def run(args):
  model = Model(args.engine, args.mib, args.vars)
  m = float(model.nbytes)
  result = dict(
    engine=args.engine,
    mode=args.mode,
    nbytes=model.nbytes,
    vars=args.vars,
    max_to_keep=args.max_to_keep,
    parts={},
    times={},
  )
  model.fill(1)
  first = model.hashes()
  result["resettable"] = reset_peak()
  base = rss()
  store = model.store(args.mode, args.max_to_keep, args.dir)
  sess = model.session
  times = result["times"]
  _timed(times, "snapshot_first", lambda: store.snapshot(1, **sess))
  model.fill(2)
  second = model.hashes()
  _timed(times, "snapshot", lambda: store.snapshot(2, **sess))
  model.fill(3)
  # With max_to_keep=1 the second snapshot replaced the first: restore it.
  tag, expected = (1, first) if args.max_to_keep != 1 else (2, second)
  _timed(times, "restore", lambda: store.restore(tag, **sess))
  top = peak()
  held = held_models(args.engine, args.mode, args.max_to_keep)
  result["core"] = dict(
    base=base,
    peak=top,
    held_models=held,
    extra_models=(top - base) / m,
    ratio=(top - base) / (held * m),
  )
  exact = model.hashes() == expected
  store.restore(2, **sess)
  exact = exact and model.hashes() == second
  result["exact"] = exact
  if args.max_to_keep == 1:  # the parts and times use both snapshots
    store.close()
    return result

  def part(name, fn):
    reset_peak()
    start = rss()
    kept = fn()
    end = rss()
    top = peak()
    result["parts"][name] = dict(
      start=start, end=end, peak=top, transient=(top - max(start, end)) / m
    )
    return kept

  paths = args.paths.split(",") if args.paths else []
  kept = None
  if "arrays" in paths or "load_arrays" in paths:
    kept = part(
      "arrays",
      lambda: [store.arrays(1, **sess), store.arrays(2, **sess)],
    )
  if "load_arrays" in paths:
    part("load_arrays", lambda: store.load_arrays(kept[0], tag=1, **sess))
    store.restore(1, **sess)
    result["exact"] = result["exact"] and model.hashes() == first
  kept = None
  if "npz" in paths:
    path = os.path.join(args.dir, "snap.npz")
    part("save_npz", lambda: store.files.save_npz(path, tag=1, **sess))
    store.delete(1)  # loaded as a new snapshot, not over a held one
    part("load_npz", lambda: store.files.load_npz(path, tag=1, **sess))
    store.restore(1, **sess)
    result["exact"] = result["exact"] and model.hashes() == first
    os.remove(path)
  if "evaluate" in paths:
    model.fill(4)
    now = model.hashes()
    if args.engine == "graph":
      fetch = model.reads[0]
      part("evaluate", lambda: store.evaluate_with(fetch, tag=1, **sess))
    else:
      first_var = model.variables[0]
      part(
        "evaluate",
        lambda: store.evaluate_with(lambda: float(first_var[0, 0]), tag=1),
      )
    result["exact"] = result["exact"] and model.hashes() == now
  if "ring" in paths:
    # A snapshot over a held tag, as a ring of max_to_keep snapshots takes
    # each one once full: into the arrays of the one it replaces.
    model.fill(5)
    now = model.hashes()
    part("ring", lambda: store.snapshot(2, **sess))
    model.fill(6)
    store.restore(2, **sess)
    result["exact"] = result["exact"] and model.hashes() == now
  if args.time:
    result["times"].update(_time_calls(store, sess, args.time))
  store.close()
  if "load_spill" in paths and args.mode == "disk":
    # The closed store wrote what it held to its file; a host store of the
    # same model reads snapshot 1 back from it.
    other = model.store("host", args.max_to_keep, args.dir)
    spill = os.path.join(args.dir, "spill.h5")
    part("load_spill", lambda: other.files.load_spill(spill, 1, tag=1))
    other.restore(1, **sess)
    result["exact"] = result["exact"] and model.hashes() == first
    other.close()
  return result


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("engine", choices=["graph", "eager"])
  p.add_argument("mode", choices=["device", "host", "disk"])
  p.add_argument("--mib", type=float, default=256.0)
  p.add_argument("--vars", type=int, default=8)
  p.add_argument("--max-to-keep", type=int, default=2)
  p.add_argument("--dir", default=None)
  p.add_argument("--paths", default="")
  p.add_argument("--time", type=int, default=0, help="rounds of timed calls")
  args = p.parse_args(argv)
  sys.path.insert(0, _ROOT)
  from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

  if args.engine == "graph":
    tf.disable_v2_behavior()
  if args.dir is None:
    import tempfile  # pylint: disable=g-import-not-at-top

    with tempfile.TemporaryDirectory() as d:
      args.dir = d
      result = run(args)
  else:
    result = run(args)
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
