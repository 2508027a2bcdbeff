"""What an eager guard checks of its step's result: `Guard(watch_result=...)`.

An eager step is a function (a `tf.function` train step, or any callable);
`guard.run(fn, *args, **kwargs)` checks the part of what it returns that
`watch_result` picks:

- None or False: nothing;
- True: every leaf of the result, a nest of lists, tuples and dicts of float
  tensors or numbers;
- an int or a string: `result[watch_result]`, a tuple's element or a dict's
  key, and every leaf under it;
- a function: every leaf of `watch_result(result)`.

A `RemoteValue` (the result of a function scheduled on a
`ClusterCoordinator`) is fetched first, which waits for that function.

    picker = ResultPicker("loss", "watch_result")
    names, values = picker.pick({"loss": loss, "acc": acc})
    # (["result['loss']"], [loss.numpy()])
"""

from snapstore._tf import tf
from snapstore.engines.eager import distributed


class ResultPicker(object):
  """What an eager guard checks of its step's result (see module doc).

  Args:
    spec: The argument as given: None, a bool, an int or string, or a
      function.
    argument: Its name as the user wrote it, for messages.

  Raises:
    TypeError: Any other `spec` (a tensor: the graph-mode form), or ''.
  """

  def __init__(self, spec, argument):
    if not (
      spec is None
      or isinstance(spec, (bool, int, str))
      or (callable(spec) and not isinstance(spec, tf.Tensor))
    ):
      raise TypeError(
        "On an eager store, %s picks what guard.run's function returns: "
        "True (all of it), an index or key (%s=0, %s='loss'), or a "
        "function of the result (%s=lambda out: out[0]); got %r. "
        "Tensors to fetch are for graph mode."
        % (argument, argument, argument, argument, spec)
      )
    if isinstance(spec, str) and not spec:
      raise TypeError(
        "%s='' picks nothing; name a key of the result." % argument
      )
    self.spec = spec
    self._argument = argument

  def pick(self, result):
    """(names, values) to check in `result`; none for None or False.

    Raises:
      TypeError: The spec picks an index or key the result does not have.
    """
    spec = self.spec
    if spec is None or spec is False:
      return [], []
    # `guard.run(coordinator.schedule, step, ...)`: the step's result.
    result = distributed.fetched(result)
    if spec is True:
      return _leaves("result", result)
    if isinstance(spec, (int, str)):
      try:
        picked = result[spec]
      except (KeyError, IndexError, TypeError, ValueError) as e:
        raise TypeError(
          "%s=%r picks result[%r], but the function returned %s, which "
          "has no such element (%s: %s). Pick an element it has, or pass "
          "%s=True to check all of it."
          % (
            self._argument,
            spec,
            spec,
            _kind(result),
            type(e).__name__,
            e,
            self._argument,
          )
        ) from e
      return _leaves("result[%r]" % (spec,), picked)
    return _leaves("%s(result)" % self._argument, spec(result))


def numpy(value):
  """An eager tensor's (or Keras variable's) numpy value, a `RemoteValue`'s
  fetched value; else `value`."""
  value = distributed.fetched(value)
  return value.numpy() if hasattr(value, "numpy") else value


def _leaves(name, value):
  """(names, values) of the leaves of a nest of lists, tuples and dicts
  (a `RemoteValue` fetched)."""
  value = distributed.fetched(value)
  if isinstance(value, dict):
    names, values = [], []
    for key in sorted(value, key=repr):
      n, v = _leaves("%s[%r]" % (name, key), value[key])
      names += n
      values += v
    return names, values
  if isinstance(value, (list, tuple)):
    names, values = [], []
    for i, item in enumerate(value):
      n, v = _leaves("%s[%d]" % (name, i), item)
      names += n
      values += v
    return names, values
  return [name], [numpy(value)]


def _kind(value):
  if isinstance(value, (list, tuple, dict)):
    return "a %s of %d" % (type(value).__name__, len(value))
  return "a %s" % type(value).__name__
