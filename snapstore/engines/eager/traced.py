"""Store calls inside the user's `tf.function`: the snapshot of each run.

A store call traced into a `tf.function` runs every time the function runs,
but what the store holds is Python state that changes between runs: a tag is
taken again, moves to another slot, is deleted. A traced call must not fix
that state when it is traced. So, inside a function being traced:

- `evaluate_with(fn, tag=t)` traces `fn` into a function of its own and
  calls it with other variables in place of the covered ones it reads
  (`ConcreteFunction` captures, replaced position by position): in device
  mode the shadows of the slot holding `t`, in host and disk mode staging
  variables filled with `t`'s arrays when the function runs. The covered
  variables are never written, so nothing has to be put back: not after
  `fn` returns, not after it fails, not when calls nest. What `fn` may write
  of the covered variables (batch norm's statistics in training mode, a
  dropout seed) it writes in a private copy made of the snapshot first (a
  swap wrote the loaded copy, then put the current values back). The result
  takes no gradient, as eagerly (`no_gradient`).
- `restore(t)` writes the slot holding `t` (device mode) or `t`'s arrays
  (host and disk mode), found when the function runs.
- Every other call is refused (`TracedCallError`, from the facade).

Device mode: which slot holds a tag is read when the function runs from
the slots' markers, one int64 scalar per slot beside its shadows, holding
the id of the tag the slot holds (`TagIds`) or -1. They are written
eagerly when a slot changes hands, once a traced call has been built (no
cost before). A tag no slot holds fails the run with an
`InvalidArgumentError` naming it (TensorFlow cannot raise snapstore's own
`UnknownTagError` from a running function). Under `jit_compile=True` XLA
drops such run-time checks: a tag deleted after tracing is then not caught.

Host and disk mode: the arrays are fetched when the function runs, by a
`tf.numpy_function` (so in this process: not on a parameter-server
strategy's remote workers, not under XLA; both refused when traced), without
the store's lock (a thread waiting on the function may hold it), into
staging variables made once per nesting depth and variable component.
"""

import collections

from snapstore import _tf
from snapstore._tf import tf
from snapstore._tf import tf2
from snapstore._tf import resource_variable_ops
from snapstore.core.distributed import (
  component_array as distributed_component_array,
)
from snapstore.core.distributed import components
from snapstore.core.distributed import replica_layout as distributed_layout
from snapstore import errors
from snapstore.core.distributed import in_replica_context
from snapstore.core import writers

# Marker value of a slot that holds no tag.
NO_TAG = -1
# Int tags in [0, _DIRECT) are their own id; other tags get negative ids.
_DIRECT = 1 << 62


def is_traced():
  """True while a `tf.function` is traced (not under `init_scope` in one)."""
  return _tf.inside_function() and not tf2.executing_eagerly()


def refuse(store_name, what, fix):
  """The `TracedCallError` for call `what` traced into a `tf.function`."""
  return errors.TracedCallError(
    "%s() on store %r was called while a tf.function is traced. What the "
    "store holds is Python state that changes between the function's runs, "
    "so the call would be fixed to what it was when the function was "
    "traced. Instead, %s." % (what, store_name, fix)
  )


def snapshot_fix(has_slots):
  """What to call instead of `snapshot()` inside a traced step, on a store
  with device slots or without."""
  if has_slots:
    return (
      "take the copy in your step with store.slots.snapshot_in_step() (a "
      "device slot written inside the function), or call store.snapshot() "
      "outside the tf.function"
    )
  return (
    "call store.snapshot() outside the tf.function, between steps (a copy "
    "inside the step needs mode='device': store.slots.snapshot_in_step())"
  )


def no_gradient(structure):
  """`structure` with a `tf.stop_gradient` of each tensor in it.

  A value computed at a snapshot takes no gradient: a separate target
  network's output would take none to the online network's variables.
  """

  def stop(value):
    if isinstance(value, tf.Tensor) and value.dtype not in (
      tf.resource,
      tf.variant,
    ):
      return tf.stop_gradient(value)
    return value

  return tf2.nest.map_structure(stop, structure, expand_composites=True)


class TagIds(object):
  """Tags as the int64 ids a slot's marker holds.

  An int tag in [0, 2**62) is its own id (the default tags count up from 0:
  nothing to remember); any other tag (a string) gets a negative id, below
  `NO_TAG`, kept for as long as the store lives.
  """

  def __init__(self):
    self._others = {}

  def __call__(self, tag):
    if isinstance(tag, int) and 0 <= tag < _DIRECT:
      return tag
    key = (type(tag), tag)
    if key not in self._others:
      self._others[key] = NO_TAG - 1 - len(self._others)
    return self._others[key]


def private_variable(part, name):
  """A plain variable like component `part`, on its device, for the store.

  Made eagerly and around any strategy's variable creator (a direct
  `ResourceVariable`): one private copy, not one per replica.
  """
  with tf2.init_scope(), tf.device(part.device):
    return resource_variable_ops.ResourceVariable(
      tf.zeros(part.shape, part.dtype),
      trainable=False,
      name=name,
      dtype=part.dtype,
      shape=part.shape,
    )


class Traced(object):
  """`fn` traced into a function of its own, with the covered reads found.

  Args:
    fn: A Python callable of no arguments (a lambda, a `tf.function`).
    variables: The store's covered variables, in key order.

  Attributes:
    reads: [(position in the captures, variable index, component index,
      component)] of each covered variable component `fn` reads.
    written: The positions in `reads` whose component `fn` may write.
  """

  def __init__(self, fn, variables):
    self._concrete = tf2.function(fn).get_concrete_function()
    parts = {}
    for i, variable in enumerate(variables):
      for c, part in enumerate(components(variable)):
        parts[id(part.handle)] = (i, c, part)
    self._inputs = list(self._concrete.captured_inputs)
    self.reads = [
      (k,) + parts[id(t)] for k, t in enumerate(self._inputs) if id(t) in parts
    ]
    inside = dict(
      (id(outer), inner)
      for outer, inner in _tf.function_captures(self._concrete)
    )
    self.written = writers.written_handles(
      [inside[id(self._inputs[k])] for k, _, _, _ in self.reads]
    )

  def __call__(self, handles):
    """Runs `fn` reading `handles[j]` in place of `reads[j]`'s component."""
    inputs = list(self._inputs)
    for (k, _, _, _), handle in zip(self.reads, handles):
      inputs[k] = handle
    return _tf.call_with_captures(self._concrete, inputs)


def check_slot(markers, tag_id, message):
  """The slot whose marker holds `tag_id`, as an int32 tensor, when the
  function runs; fails the run with `message` if none does."""
  held = tf.stack([m.read_value() for m in markers])
  hits = tf.equal(held, tf.constant(tag_id, tf.int64))
  found = tf.debugging.Assert(tf.reduce_any(hits), [message])
  with tf.control_dependencies([found]):
    return tf.identity(tf.cast(tf.argmax(tf.cast(hits, tf.int32)), tf.int32))


def by_slot(slot, num_slots, branch):
  """`branch(k)` for the slot `k` that the int32 tensor `slot` holds.

  One `tf.switch_case` over the slots; the tensors of what `branch`
  returns go through it, anything else in it (None, Python values, the
  same in every branch) is taken from the first branch's.
  """
  if num_slots == 1:
    with tf.control_dependencies([slot]):
      return branch(0)
  first = {}

  def run(k):
    out = branch(k)
    flat = tf2.nest.flatten(out, expand_composites=True)
    first.setdefault(0, (out, flat))
    return [x for x in flat if isinstance(x, tf.Tensor)]

  tensors = iter(
    tf.switch_case(slot, [lambda k=k: run(k) for k in range(num_slots)])
  )
  out, flat = first[0]
  return tf2.nest.pack_sequence_as(
    out,
    [next(tensors) if isinstance(x, tf.Tensor) else x for x in flat],
    expand_composites=True,
  )


class TracedCalls(object):
  """The calls of an eager store traced into the user's `tf.function`.

  Made by the store; its facade hands `restore` and `evaluate_with` here
  when `is_traced()` (see module doc).

  Args:
    holdings: The store's `Holdings`.
  """

  def __init__(self, holdings):
    self._h = holdings
    self._depth = 0  # evaluate_with calls being traced one inside another
    # (depth, variable index, component index) -> a private variable: the
    # copy of a slot's shadow that an evaluated function writes, or the
    # staging variable a host snapshot's array is fetched into.
    self._private = {}

  def active(self):
    """True while a `tf.function` is traced: store calls go here."""
    return is_traced()

  def snapshot_fix(self, has_slots):
    return snapshot_fix(has_slots)

  def restore(self, tag):
    """Writes snapshot `tag` into the variables when the function runs."""
    tag = self._held(tag, "restore")
    self._check_restore()
    slots = self._h.mode.slot_set
    if slots is not None:
      slot = self._slot(slots, tag)
      by_slot(slot, slots.num_slots, slots.restore_slot)
      return tag
    self._check_host("restore")
    # As a host restore writes: each variable's array, then each kept
    # component's own value (`EagerHostMode.write_values`).
    variables = self._h.varset.variables
    wanted = [(i, None) for i in range(len(variables))]
    for i, count in distributed_layout(variables):
      n = len(components(variables[i]))
      wanted.extend((i, c) for c in range(n - count, n))
    self._fast_host().write_values(self._fetch(tag, wanted))
    return tag

  def evaluate_with(self, fn, tag):
    """`fn()` at snapshot `tag`, looked up when the function runs."""
    tag = self._held(tag, "evaluate_with")
    slots = self._h.mode.slot_set
    if slots is None:
      self._check_host("evaluate_with")
    depth = self._depth
    self._depth += 1
    try:  # evaluate_with calls inside fn are traced one level deeper
      traced = Traced(fn, self._h.varset.variables)
    finally:
      self._depth = depth
    if slots is not None:
      slot = self._slot(slots, tag)

      def branch(k):
        handles = []
        for j, (_, i, c, part) in enumerate(traced.reads):
          shadow = components(slots.shadows(k, "evaluate_with")[i])[c]
          if j in traced.written:
            private = self._variable(depth, i, c, part)
            private.assign(shadow.value(), read_value=False)
            shadow = private
          handles.append(shadow.handle)
        return traced(handles)

      return no_gradient(by_slot(slot, slots.num_slots, branch))
    wanted = [(i, c) for _, i, c, _ in traced.reads]
    handles = []
    for (_, i, c, part), value in zip(traced.reads, self._fetch(tag, wanted)):
      staging = self._variable(depth, i, c, part)
      with tf.device(part.device):
        staging.assign(value, read_value=False)
      handles.append(staging.handle)
    return no_gradient(traced(handles))

  def evaluate_each(self, fn, tags):
    """`evaluate_with(fn, tag)` for each of `tags`: `{tag: fn()}`."""
    if tags is None:
      raise refuse(
        self._h.name,
        "evaluate_each",
        "pass tags=[...]: the snapshots held when the function runs are not "
        "known when it is traced",
      )
    return collections.OrderedDict(
      (tag, self.evaluate_with(fn, tag))
      for tag in self._h.tags_to_evaluate(tags)
    )

  # -- internals -----------------------------------------------------------------

  def _held(self, tag, what):
    """`tag`, held now: a traced call names its snapshot."""
    if tag is None:
      raise refuse(
        self._h.name,
        what,
        "pass tag=: the newest snapshot when the function runs is not "
        "known when it is traced (%s(tag=...) looks that tag up at every "
        "run)" % what,
      )
    with self._h.lock:
      self._h.check_open()
      return self._h.catalog.existing(tag, allow_default=False)

  def _check_restore(self):
    if in_replica_context():
      raise ValueError(
        "restore() was called inside strategy.run (replica context): it "
        "writes every replica's component itself, so each replica would "
        "run it. Call it in the step's cross-replica part, after "
        "strategy.run returns."
      )
    if self._h.coordinator is not None:
      raise refuse(
        self._h.name,
        "restore",
        "call store.restore(tag) eagerly, between steps: under "
        "MultiWorkerMirroredStrategy every worker must restore the same "
        "snapshot at the same point, which the store checks then",
      )

  def _check_host(self, what):
    """Host and disk mode fetch arrays in this process (module doc)."""
    if self._h.engine.ps_strategies:
      raise refuse(
        self._h.name,
        what,
        "use a store with mode='device' (its shadows live on the parameter "
        "servers, where the workers running the function read them): a "
        "%s-mode snapshot is numpy arrays in this process, which the "
        "workers cannot fetch" % self._h.mode.name,
      )
    if _tf.in_xla_context():
      raise refuse(
        self._h.name,
        what,
        "use a store with mode='device', or call it outside the "
        "jit_compile=True function: a %s-mode snapshot is fetched from "
        "numpy by tf.numpy_function, which XLA cannot compile"
        % self._h.mode.name,
      )

  def _slot(self, slots, tag):
    """The slot holding `tag` when the function runs (int32 tensor)."""
    slots.start_marking()
    # No quotes: TensorFlow escapes them in an assertion's message.
    message = (
      "UnknownTagError: the store %s holds no snapshot under tag %s in a "
      "device slot now: it was deleted, evicted or spilled after this "
      "tf.function was traced (store.tags() lists what it holds)"
      % (self._h.name, tag)
    )
    return check_slot(slots.markers, slots.tag_id(tag), message)

  def _fast_host(self):
    mode = self._h.mode
    return mode.tiers.inner if mode.tiers is not None else mode

  def _variable(self, depth, i, c, part):
    key = (depth, i, c)
    if key not in self._private:
      self._private[key] = private_variable(
        part, "%s/traced_%d/%d_%d" % (self._h.name, depth, i, c)
      )
    return self._private[key]

  def _fetch(self, tag, wanted):
    """Tensors of snapshot `tag`'s values, fetched when the function runs:
    for each of `wanted`, (variable index, component index) the value a
    restore writes into that component, (variable index, None) the
    variable's array."""
    variables = self._h.varset.variables
    mode = self._h.mode
    name = self._h.name

    def values():
      # No lock: a thread waiting for this function may hold the store's.
      try:
        arrays = mode.arrays(tag, None)
        replicas = mode.replicas(tag, None) or {}
      except KeyError:
        try:
          held = ", ".join(str(t) for t in self._h.catalog.tags())
        except RuntimeError:  # changed while listed
          held = "see store.tags()"
        raise ValueError(
          "UnknownTagError: the store %s holds no snapshot under tag %s now "
          "(it holds: %s): it was deleted or evicted after this tf.function "
          "was traced" % (name, tag, held or "none")
        ) from None
      return [
        arrays[i]
        if c is None
        else distributed_component_array(
          variables[i], c, arrays[i], replicas.get(i)
        )
        for i, c in wanted
      ]

    like = [
      variables[i] if c is None else components(variables[i])[c]
      for i, c in wanted
    ]
    fetched = tf.numpy_function(
      values,
      [],
      [v.dtype.base_dtype for v in like],
      stateful=True,
      name="fetch_snapshot",
    )
    for value, v in zip(fetched, like):
      value.set_shape(v.shape)
    return fetched
