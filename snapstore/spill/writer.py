"""A background thread that runs file writes in order, with a bounded queue.

The training thread hands over a job (a callable) and goes on; the writer runs
jobs one at a time, in the order given, and records each outcome. The caller
collects outcomes with `done()` whenever it likes, so every change to the
caller's own bookkeeping happens on the caller's thread.

Back-pressure: at most `max_pending` jobs wait or run at once; `submit` blocks
until the writer has room. A store that snapshots faster than its disk writes
therefore slows down to the disk's pace instead of growing its queue without
bound.

At interpreter exit, every object registered with `close_at_exit` that is
still alive is closed (its `close_at_exit()`), so that queued writes are
finished, or the ones that cannot be are reported, before the process ends.

    writer = BackgroundWriter("spill", max_pending=2)
    writer.submit(job)          # returns at once unless 2 jobs are pending
    writer.flush()              # waits until every job has run
    for job, error in writer.done():
      ...
    writer.close()
"""

import atexit
import collections
import sys
import threading
import weakref

from snapstore.core import checks


class BackgroundWriter(object):
  """Runs submitted callables in order on one daemon thread.

  Args:
    name: The thread's name.
    max_pending: How many jobs may wait or run at once (>= 1).

  Raises:
    TypeError: `max_pending` is not an int.
    ValueError: `max_pending` < 1.
  """

  def __init__(self, name, max_pending):
    self._max_pending = checks.integer(max_pending, "max_pending", 1)
    self._cond = threading.Condition()
    self._queue = collections.deque()
    self._running = 0
    self._done = []
    self._closed = False
    self._thread = threading.Thread(target=self._loop, name=name)
    self._thread.daemon = True  # atexit (below) finishes the work first
    self._thread.start()

  @property
  def pending(self):
    """Jobs submitted and not finished."""
    with self._cond:
      return len(self._queue) + self._running

  def submit(self, job):
    """Queues `job()`; blocks while `max_pending` jobs are pending.

    Raises:
      RuntimeError: The writer is closed.
    """
    with self._cond:
      while (
        len(self._queue) + self._running >= self._max_pending
        and not self._closed
      ):
        self._cond.wait()
      if self._closed:
        raise RuntimeError("The background writer is closed.")
      self._queue.append(job)
      self._cond.notify_all()

  def done(self):
    """[(job, exception or None)] of jobs finished since the last call, in order."""
    with self._cond:
      out, self._done = self._done, []
    return out

  def flush(self):
    """Waits until every submitted job has run."""
    with self._cond:
      while self._queue or self._running:
        self._cond.wait()

  def close(self):
    """Runs what is queued, then stops the thread. Safe to call twice."""
    with self._cond:
      if self._closed:
        return
      self._closed = True
      self._cond.notify_all()
    if threading.current_thread() is not self._thread:
      self._thread.join()

  def _loop(self):
    while True:
      with self._cond:
        while not self._queue and not self._closed:
          self._cond.wait()
        if not self._queue:
          return
        job = self._queue.popleft()
        self._running = 1
      error = None
      try:
        job()
      except BaseException as e:  # pylint: disable=broad-except
        error = e  # reported to the caller through done()
      with self._cond:
        self._running = 0
        self._done.append((job, error))
        self._cond.notify_all()
      # The outcome is the caller's now; waiting for the next job must not
      # keep it (a snapshot's arrays, a traceback's frames) alive.
      job = error = None


_AT_EXIT = weakref.WeakSet()


def close_at_exit(obj):
  """Calls `obj.close_at_exit()` at interpreter exit if `obj` is alive then.

  That method must release everything, whatever it raises: the process ends
  next. Its exception's message is written to stderr.
  """
  _AT_EXIT.add(obj)


def _close_all():
  for obj in list(_AT_EXIT):
    try:
      obj.close_at_exit()
    except Exception as e:  # pylint: disable=broad-except
      sys.stderr.write("snapstore: at exit: %s\n" % e)
      sys.stderr.flush()


atexit.register(_close_all)
