"""A TensorFlow cluster on loopback: one `tf.train.Server` process per task.

    with cluster.LoopbackCluster({"ps": 2, "worker": 2}) as c:
      c.spec                   # {"ps": ["127.0.0.1:40001", ...], "worker": [...]}
      c.target("worker", 0)    # "grpc://127.0.0.1:..." for tf.Session

`unserved={"chief": 1}` puts tasks in the spec that no process serves: the
test starts them itself (an Estimator's chief starts its own server).

Ports are chosen free at run time; if a task cannot bind its port (taken in
between), the cluster is started again on new ports. Each task process exits
when its stdin closes: when `close()` closes it, and also when the test process
dies without cleaning up, so no server outlives the tests. `close()` kills what
does not exit in time.

Run as `python -m tests.cluster SPEC JOB TASK` it is one task's server.
"""

import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_READY = b"ready\n"


class ClusterError(Exception):
  """A task's server did not start; the message holds the end of its stderr."""


class LoopbackCluster(object):
  """Server processes for `tasks` ({job: count}); see module doc.

  Raises:
    ClusterError: The servers did not start after `attempts` tries.
  """

  def __init__(self, tasks, start_timeout=60, attempts=3, unserved=None):
    self._procs = []
    self.spec = None
    problem = None
    for _ in range(attempts):
      try:
        self._start(tasks, start_timeout, unserved or {})
        return
      except ClusterError as e:
        problem = e
        self.close()
    raise problem

  def target(self, job, task):
    return "grpc://" + self.spec[job][task]

  def alive(self):
    return all(p.poll() is None for p, _ in self._procs)

  def close(self):
    """Stops every task: closes its stdin, kills it if it does not exit. Safe twice."""
    procs, self._procs = self._procs, []
    for proc, _ in procs:
      try:
        proc.stdin.close()
      except OSError:
        pass
    deadline = time.time() + 5
    for proc, log in procs:
      try:
        proc.wait(max(0.1, deadline - time.time()))
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
      proc.stdout.close()
      log.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()

  def restart(self, job, task, timeout=60):
    """Stops task `task` of `job` and starts a new server on its port.

    As a restarted parameter server does, it comes back with none of the
    variables it held, and new device incarnations.
    """
    index = self._tasks.index((job, task))
    proc, log = self._procs[index]
    proc.stdin.close()
    proc.wait(10)
    proc.stdout.close()
    log.close()
    self._procs[index] = self._spawn(job, task)
    self._wait_ready(timeout, [self._procs[index]])

  def _start(self, tasks, timeout, unserved):
    every = dict(unserved, **tasks)
    ports = free_ports(sum(every.values()))
    self.spec = {}
    for job in sorted(every):
      self.spec[job] = ["127.0.0.1:%d" % ports.pop() for _ in range(every[job])]
    self._tasks = [
      (job, task) for job in sorted(tasks) for task in range(tasks[job])
    ]
    for job, task in self._tasks:
      self._procs.append(self._spawn(job, task))
    self._wait_ready(timeout, self._procs)

  def _spawn(self, job, task):
    env = dict(os.environ, PYTHONPATH=_ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
      [
        sys.executable,
        "-m",
        "tests.cluster",
        json.dumps(self.spec),
        job,
        str(task),
      ],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=log,
      cwd=_ROOT,
      env=env,
    )
    return proc, log

  def _wait_ready(self, timeout, procs):
    waiting = selectors.DefaultSelector()
    for proc, log in procs:
      waiting.register(proc.stdout, selectors.EVENT_READ, (proc, log))
    deadline = time.time() + timeout
    try:
      while waiting.get_map():
        left = deadline - time.time()
        events = waiting.select(max(0, left))
        if not events:
          raise ClusterError(
            "%d task(s) did not start within %d s."
            % (len(waiting.get_map()), timeout)
          )
        for key, _ in events:
          proc, log = key.data
          if proc.stdout.readline() != _READY:
            proc.wait()
            log.seek(0)
            raise ClusterError(
              "A server exited with status %s: %s"
              % (proc.returncode, log.read()[-2000:].decode(errors="replace"))
            )
          waiting.unregister(proc.stdout)
    finally:
      waiting.close()


class ClusterTestMixin(object):
  """A test class's one `LoopbackCluster`: started in `setUpClass`, closed in
  `tearDownClass`; each test skipped with the reason if it could not start,
  checked alive, and given `self.scope`, a name scope of its own (variables
  on the ps tasks outlive sessions). Put it first in the bases:

      class MyTest(cluster.ClusterTestMixin, tf.test.TestCase):
        JOBS = {"ps": 2, "worker": 1}
        SCOPE = "my_"
  """

  JOBS = None
  SCOPE = "net_"
  cluster = None
  skip_reason = None

  @classmethod
  def unavailable(cls):
    """A reason to skip every test before starting the cluster, or None."""
    return None

  @classmethod
  def setUpClass(cls):
    super(ClusterTestMixin, cls).setUpClass()
    cls.skip_reason = cls.unavailable()
    if cls.skip_reason:
      return
    try:
      cls.cluster = LoopbackCluster(cls.JOBS)
    except ClusterError as e:
      cls.skip_reason = (
        "loopback tf.train.Server processes did not start: %s" % e
      )

  @classmethod
  def tearDownClass(cls):
    if cls.cluster is not None:
      cls.cluster.close()
    super(ClusterTestMixin, cls).tearDownClass()

  def setUp(self):
    super(ClusterTestMixin, self).setUp()
    if self.skip_reason:
      self.skipTest(self.skip_reason)
    self.assertTrue(self.cluster.alive(), "a server process died")
    self.scope = self.SCOPE + self.id().rsplit(".", 1)[-1]


def free_ports(n):
  """`n` distinct ports free now (bound together, then released)."""
  sockets = []
  try:
    for _ in range(n):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      s.bind(("127.0.0.1", 0))
      sockets.append(s)
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


_WORKERS_TIMEOUT = 120  # seconds for a whole two-worker run, startup included


def run_workers(module, scenario, out, count=2):
  """Runs `count` worker processes of `python -m module PORTS INDEX SCENARIO
  OUT` on free loopback ports; returns ([facts], [arrays]) per worker.

  Each worker writes OUT/<index>.json and .npz and says "ok"
  (`finish_worker`), then serves until its stdin closes, which happens once
  every worker has written (or one failed, or the run took more than
  `_WORKERS_TIMEOUT` seconds: then all are killed). A worker exiting first
  could take its server from under another's last collective.

  Raises:
    AssertionError: A worker failed; its log's end is in the message.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top

  ports = free_ports(count)
  env = dict(os.environ, PYTHONPATH=_ROOT, TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("TF_CONFIG", None)
  procs = []
  for index in range(count):
    log = open(os.path.join(out, "%d.log" % index), "w+")
    command = [sys.executable, "-m", module]
    command += [json.dumps(ports), str(index), scenario, out]
    proc = subprocess.Popen(
      command,
      stdin=subprocess.PIPE,
      stdout=log,
      stderr=subprocess.STDOUT,
      cwd=_ROOT,
      env=env,
    )
    procs.append((proc, log))
  deadline = time.time() + _WORKERS_TIMEOUT
  done = lambda: all(  # noqa: E731
    os.path.exists(os.path.join(out, "%d.json" % i)) for i in range(count)
  )
  try:
    while not done() and time.time() < deadline:
      if any(p.poll() is not None for p, _ in procs):
        break  # one exited before all were done: it failed
      time.sleep(0.1)
    for proc, _ in procs:
      proc.stdin.close()
    for proc, _ in procs:
      proc.wait(max(1, deadline - time.time()))
  except subprocess.TimeoutExpired:
    pass
  finally:
    for proc, _ in procs:
      if proc.poll() is None:
        proc.kill()
      proc.wait()
  problems = []
  for index, (proc, log) in enumerate(procs):
    log.seek(0)
    text = log.read()
    log.close()
    if proc.returncode != 0 or "ok" not in text.split():
      problems.append(
        "worker %d exited with %s:\n%s" % (index, proc.returncode, text[-3000:])
      )
  assert not problems, "\n".join(problems)
  facts, arrays = [], []
  for index in range(count):
    with open(os.path.join(out, "%d.json" % index)) as f:
      facts.append(json.load(f))
    with np.load(os.path.join(out, "%d.npz" % index)) as held:
      arrays.append({k: held[k] for k in held.files})
  return facts, arrays


def worker_config(ports, index):
  """The TF_CONFIG of worker `index` of a cluster of workers on `ports`."""
  return json.dumps(
    {
      "cluster": {"worker": ["127.0.0.1:%d" % p for p in ports]},
      "task": {"type": "worker", "index": index},
    }
  )


def finish_worker(out, index, arrays, facts):
  """A worker's end under `run_workers`: writes what it saw, says "ok",
  serves until stdin closes, then exits at once (TF 1.15's Server.__del__
  fails at interpreter exit; nothing else needs closing)."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  np.savez(os.path.join(out, "%d.npz" % index), **arrays)
  with open(os.path.join(out, "%d.json" % index), "w") as f:
    json.dump(facts, f)
  print("ok", flush=True)
  sys.stdin.read()
  os._exit(0)  # pylint: disable=protected-access


def _serve(spec, job, task):
  from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

  tf.disable_v2_behavior()  # graph mode on TensorFlow 2.x
  server = tf.train.Server(
    tf.train.ClusterSpec(spec),
    job_name=job,
    task_index=task,
    config=tf.ConfigProto(device_count={"CPU": 1}),
  )
  sys.stdout.buffer.write(_READY)
  sys.stdout.flush()
  sys.stdin.read()  # until the parent closes stdin or dies
  del server
  os._exit(0)  # a tf.train.Server cannot be stopped cleanly in TF 1.15


if __name__ == "__main__":
  _serve(json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
