"""A defined, reproducible background load for benchmarks (`--load N`).

`Load(n, kind)` starts `n` processes that keep one CPU each busy for as long
as the benchmark runs, and stops them (by their own pids) at the end:

  spin    a Python busy loop in a new process: pure CPU, no memory
          traffic; takes CPU time from the benchmark's threads only
  matmul  a one-thread numpy float64 matmul of two 512 x 512 matrices in a
          loop (OMP/OPENBLAS/MKL threads set to 1): CPU plus cache and some
          memory traffic
  memcpy  a one-thread numpy copy of a 64 MiB array into another in a loop:
          competes for memory bandwidth as well as CPU

The processes run at the benchmark's own priority (no nice). With `pin=True`
(`--load-pin`) process i is bound to CPU i (mod the CPUs this process may use),
so that each core carries the same load all the time; unpinned, the scheduler
moves them, and a benchmark thread sometimes gets a core to itself.
`describe()` says what runs, with the load average, for the benchmark's output.

    with busy_load.Load(2, "spin", pin=True) as load:
      print(load.describe())
      ...  # the timed rounds
"""

import os
import subprocess
import sys
import time

KINDS = ("spin", "matmul", "memcpy")

# Each process stops by itself once the benchmark that started it is gone
# (its parent pid changes), so a killed benchmark leaves no busy loop behind.
_CODE = {
  "spin": (
    "import os\n"
    "parent = os.getppid()\n"
    "while os.getppid() == parent:\n"
    "  for _ in range(1000000):\n"
    "    pass\n"
  ),
  "matmul": (
    "import os\n"
    "import numpy as np\n"
    "parent = os.getppid()\n"
    "a = np.random.rand(512, 512)\n"
    "b = np.random.rand(512, 512)\n"
    "while os.getppid() == parent:\n"
    "  a.dot(b)\n"
  ),
  "memcpy": (
    "import os\n"
    "import numpy as np\n"
    "parent = os.getppid()\n"
    "a = np.ones(8 << 20)\n"
    "b = np.empty_like(a)\n"
    "while os.getppid() == parent:\n"
    "  np.copyto(b, a)\n"
  ),
}


def add_arguments(parser):
  """Adds `--load N` and `--load-kind` to an argparse parser."""
  parser.add_argument(
    "--load",
    type=int,
    default=0,
    metavar="N",
    help="run N busy processes for the whole run (default 0: none); "
    "see bench/busy_load.py",
  )
  parser.add_argument(
    "--load-kind",
    choices=KINDS,
    default="spin",
    help="what each busy process does (default spin: a Python busy loop)",
  )
  parser.add_argument(
    "--load-pin",
    action="store_true",
    help="bind busy process i to CPU i, so each core carries one (default: "
    "the scheduler places them)",
  )


def loadavg():
  try:
    return " ".join("%.2f" % x for x in os.getloadavg())
  except OSError:
    return "?"


class Load(object):
  """`n` busy processes of `kind` while the context is open (see module doc)."""

  def __init__(self, n, kind="spin", pin=False):
    if kind not in KINDS:
      raise ValueError("load kind must be one of %s, got %r" % (KINDS, kind))
    self.n = n
    self.kind = kind
    self.pin = pin
    self._cpus = []
    self._procs = []

  def __enter__(self):
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
      env[var] = "1"
    for _ in range(self.n):
      self._procs.append(
        subprocess.Popen(
          [sys.executable, "-c", _CODE[self.kind]],
          env=env,
          stdin=subprocess.DEVNULL,
          stdout=subprocess.DEVNULL,
          stderr=subprocess.DEVNULL,
        )
      )
    if self.pin:
      allowed = sorted(os.sched_getaffinity(0))
      for i, p in enumerate(self._procs):
        cpu = allowed[i % len(allowed)]
        os.sched_setaffinity(p.pid, {cpu})
        self._cpus.append(cpu)
    if self.n:
      time.sleep(2.0)  # let them start (imports) before anything is timed
    return self

  def __exit__(self, *exc):
    for p in self._procs:
      p.terminate()
    for p in self._procs:
      try:
        p.wait(timeout=10)
      except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    self._procs = []
    self._cpus = []
    return False

  @property
  def pids(self):
    """The busy processes' pids (empty outside the context)."""
    return [p.pid for p in self._procs]

  @property
  def cpus(self):
    """The CPU each process is bound to (empty when not pinned)."""
    return list(self._cpus)

  def describe(self):
    if not self.n:
      return "load: none started (--load 0); load average %s" % loadavg()
    alive = sum(p.poll() is None for p in self._procs)
    where = (
      "pinned to CPUs %s" % ",".join(str(c) for c in self._cpus)
      if self.pin
      else "unpinned"
    )
    return (
      "load: %d busy '%s' processes (bench/busy_load.py; %d running, pids %s, "
      "%s) on %s CPUs; load average %s"
      % (
        self.n,
        self.kind,
        alive,
        ",".join(str(pid) for pid in self.pids),
        where,
        os.cpu_count(),
        loadavg(),
      )
    )
