"""Guards and trials on an eager store: a step is a call of the step function.

`guard.run(fn, *args, **kwargs)` calls `fn` (a `tf.function` train step, or
any Python callable), returns what it returned, and checks the part of it
that `Guard(watch_result=...)` picks (`result_picker.py`). A trial's metric
is a function of no arguments, called before and after the block, its
tensors turned into numpy values. No call takes a session or a feed.

An eager guard or trial takes its snapshot on entry, always, and refuses a
pinned tag, `store.slots.snapshot_in_step()`'s too: the user's
`tf.function` writes that slot where no guard can count the writes. Why:
docs/design/guards.md, "Eager guards and pinned tags".
"""

from snapstore._tf import tf
from snapstore.training import result_picker
from snapstore.training import runner


class EagerRunner(runner.Runner):
  """The eager engine's part of a guard or trial (see module doc).

  Raises:
    TypeError: A `session` (the store's engine refuses it).
  """

  engine = "eager"
  watch_argument = "watch_result"
  call_means = "call_step"

  def __init__(self, store, session, what):
    super(EagerRunner, self).__init__(store, session, what)
    if session is not None:
      store.engine.session(session, "snapstore.%s" % what)

  # -- what a guard watches -----------------------------------------------------------

  def watch_tensors(self, value, argument):
    if value is None:
      return []
    raise TypeError(
      "%s=%r names tensors that a graph-mode guard fetches in each "
      "session.run, but this store runs eagerly. Pass watch_result= to pick "
      "what the step function returns: True (all of it), an index or key "
      "(watch_result='loss'), or a function of the result." % (argument, value)
    )

  def watch_result(self, value, argument):
    return result_picker.ResultPicker(value, argument)

  # -- a guard's tag -----------------------------------------------------------------

  def check_unpinned(self, tag, what):
    slots = self.slots()
    if slots is None or tag not in slots.pinned():
      return
    raise ValueError(
      "%s(tag=%r): that tag is pinned to slot %d, which your own code "
      "writes: an in-step snapshot (store.slots.snapshot_in_step) in your "
      "tf.function, or your ops after store.slots.pin. The %s cannot see "
      "those writes (the function may run its step outside the block, more "
      "than once, or skip the copy with commit(if_finite=...)), so when it "
      "rolled back the slot could hold another state than the block's "
      "start. Give the %s another tag (the default %r), which takes a "
      "snapshot of its own on entry; or, with an unconditional in-step "
      "snapshot, call store.restore(%r) yourself after a step whose loss "
      "is not finite (the slot then holds that step's start)."
      % (what, tag, slots.slot_of(tag), what, what, what, tag)
    )

  def new_attempt(self, use):
    return _Calls(use)

  # -- a trial's metric --------------------------------------------------------------

  def check_metric(self, metric, feed_dict):
    if metric is not None and not callable(metric):
      raise TypeError(
        "On an eager store, a trial's metric is a function of no arguments "
        "that returns the metric (e.g. metric=lambda: loss_fn(y_held, "
        "model(x_held))), called before and after the block; got %r."
        % (metric,)
      )
    if feed_dict is not None:
      raise TypeError(
        "On an eager store, a trial takes no feed_dict: pass the metric's "
        "inputs inside its function (metric=lambda: loss_fn(y_held, "
        "model(x_held)))."
      )

  def evaluate(self, metric, feed_dict):
    del feed_dict
    return tf.nest.map_structure(result_picker.numpy, metric())


class _Calls(runner.AttemptSteps):
  """One attempt's calls of step functions.

  Args:
    use: The guard's use (`attempts.Use`) the attempt belongs to.
  """

  def __init__(self, use):
    self._use = use

  def run(self, fetches, args, kwargs):
    fn = fetches
    if not callable(fn):
      raise TypeError(
        "guard.run() on an eager store calls a function with its arguments, "
        "e.g. guard.run(train_step, x, y) for a tf.function train_step; got "
        "%r. Sessions and fetches are for graph mode." % (fn,)
      )
    result = fn(*args, **kwargs)
    names, values = self._use.picker.pick(result)
    return result, names, values
