"""Inside the wrapped train step: how `SnapshotCallback(in_step=True)` undoes it.

Two ways, chosen by `in_step_undo` through `WAYS`; each is traced into the
train step by `in_step_keeper.InStepKeeper` and answers the same calls:

    undo = WAYS["copy"](keeper)
    undo.check(strategy)           # on_train_begin: refuses what it cannot do
    undo.start(model, strategy)    # on_train_begin: True if prepared already
    undo.prepare(model, step, data)  # the first trace in a fit
    logs = undo.guarded(step, data)  # the step, undone when not finite

- "copy" (`CopyUndo`): the state is read at the step's start; when the
  step's `logs[monitor]` is finite (on every replica) the reads are
  committed into the store's slot, else written back into the variables,
  or, when the start's weights are not finite, the slot is. The store is a
  device store with one slot, pinned under `in_step_tag`.
- "skip" (`SkipUndo`): the optimizer's update is applied only when the
  logged value is finite; what the rest of the step writes is read at its
  start and put back when it was not. No store, nothing older to go back to.

Either way a rollback adds 1 to both of the keeper's counts (rollbacks, in
a row), a kept step zeroes the second, and the learning rate is multiplied
by `backoff`. The mechanism, its costs and its limits:
docs/design/callback.md, "In-step mode".
"""

from snapstore._tf import keep_cond_as_call
from snapstore._tf import tf2
from snapstore.engines.eager import distributed
from snapstore.engines.eager import skip_update
from snapstore.training import keras_state
from snapstore.training import train_step


class CopyUndo(object):
  """`in_step_undo="copy"`: the step's start, kept in a slot or written back.

  Args:
    keeper: The `InStepKeeper` (its options, model, counts and replicas).
  """

  def __init__(self, keeper):
    self._keeper = keeper
    self.store = None
    self._built_for = None  # (model, optimizer) the store was made for
    self._snap = None  # the store's InStepSnapshot
    self._from_slot = []  # (variable, shadow) of the slot
    self._restored = []  # what the step's start puts back
    self._weights = []  # trainable floats, checked at the start
    self._made_with = frozenset()  # ids of the variables before the step

  def check(self, strategy):
    del strategy  # copying works under every strategy with replicas

  def start(self, model, strategy):
    """Under replicas, makes the store now (module doc of the design note,
    "Replicas"): returns True then."""
    self._snap = None  # made again at the first trace of this fit's step
    if self._keeper.replicas == 1:
      return False
    # The first trace runs in replica context, where neither the scratch
    # trace (the step's gradient all-reduce cannot run in a nested function
    # there) nor the store's shadows can be made: made now.
    with strategy.scope():
      keras_state.build_compiled_metrics(model)
      # (Builds the optimizer too, in the strategy's scope.)
      made = keras_state.default_variables(model)
      self._made_with = frozenset(id(v) for v in made)
      self._make_store(model)
    return True

  def prepare(self, model, step, data):
    """Traces `step` in a scratch function, then makes the store (doc)."""
    _scratch_trace(step, data)
    with tf2.init_scope():
      self._make_store(model)

  def _make_store(self, model):
    """The store (made or reused), its slot pinned and written now."""
    keeper = self._keeper
    options = keeper.options
    followed = keeper.followed()
    if options.store is None:
      optimizer = model.optimizer
      covered = (
        frozenset(id(v) for v in self.store.variables.values())
        if (self.store is not None and self._built_for == (model, optimizer))
        else frozenset()
      )
      if not covered or any(
        id(v) not in covered
        for v in keras_state.default_variables(model) + list(followed.values())
      ):
        if self.store is not None:
          self.store.close()  # ours: its shadows are freed
        self.store = keras_state.default_store(model, followed, max_to_keep=1)
        self._built_for = (model, optimizer)
    elif self.store is None or self._built_for[0] is not model:
      store = keras_state.own_store(options.store, model)
      if store is not options.store:  # made by your function: checked now
        keras_state.check_in_step_store(store)
        keeper.check_covers(store, followed)
      self.store = store
      self._built_for = (model, None)
    self._snap = self.store.slots.snapshot_in_step(0, options.in_step_tag)
    self._snap()  # the slot holds the start of this fit
    covered = frozenset(id(v) for v in self.store.variables.values())
    variables = list(self.store.variables.values())
    shadows = list(self.store.slots.shadows(0).values())
    self._from_slot = list(zip(variables, shadows))
    # Restored from the step's start: the store's variables, and the
    # metrics a store of your own leaves out (the logs' running means).
    self._restored = variables + [
      v for v in keras_state.metric_variables(model) if id(v) not in covered
    ]
    self._weights = keras_state.trainable_floats(model)

  def _check_made_before(self, model):
    """Under replicas: refuses a step that made state after the store.

    Raises:
      ValueError: The step made variables (tf-keras builds the compiled
        metrics in the first step) that the store, made at
        `on_train_begin`, neither covers nor can restore.
    """
    names = dict(
      (id(keras_state.inner(v)), "%s/%s" % (m.name, v.name.split(":")[0]))
      for m in model.metrics
      for v in m.variables
    )
    new = [
      names.get(id(v), v.name)
      for v in keras_state.default_variables(model)
      if id(v) not in self._made_with
    ]
    if new:
      raise ValueError(
        "SnapshotCallback(in_step=...) under %s with %d replicas makes its "
        "store at on_train_begin, but the first train step made more "
        "variables, which a rollback would not restore: %s (tf-keras makes "
        "a subclassed model's compiled metrics in the first step). Run one "
        "step first (e.g. "
        "model.train_on_batch or a 1-batch fit) so that they exist, or use "
        "every_n_batches=."
        % (
          type(model.distribute_strategy).__name__,
          self._keeper.replicas,
          ", ".join(sorted(new)),
        )
      )

  def guarded(self, step, data):
    """The step, copying its start into the slot or restoring it.

    Under a strategy with replicas this runs in each replica: every write
    goes to that replica's own component (`distributed.local`), and the
    decision is on all replicas' values (one all-reduce), so that all undo
    the step together: the gradients were summed across them.
    """
    keeper = self._keeper
    local = distributed.local
    start = self._snap.begin()
    reads = []
    for variable in self._restored:  # one read each: begin()'s where it has one
      value = start.value_of(variable)
      reads.append(
        (variable, local(variable).value() if value is None else value)
      )
    logs = step(data)
    if keeper.replicas > 1:
      self._check_made_before(keeper.model)
    monitor = keeper.options.monitor
    _check_logs(logs, monitor)
    value = tf2.convert_to_tensor(logs[monitor])
    finite = tf2.reduce_all(tf2.math.is_finite(value))
    if distributed.in_replica_context():
      context = tf2.distribute.get_replica_context()
      finite = tf2.equal(
        context.all_reduce(
          tf2.distribute.ReduceOp.SUM, tf2.cast(finite, tf2.int32)
        ),
        context.num_replicas_in_sync,
      )
    counts = local(keeper.counts)

    def commit():
      start.commit()
      counts.assign(counts * tf2.constant([1, 0], tf2.int64), read_value=False)
      return tf2.constant(True)

    def from_slot():
      for variable, shadow in self._from_slot:
        local(variable).assign(local(shadow).read_value(), read_value=False)
      return tf2.constant(True)

    def roll_back():
      for variable, read in reads:
        local(variable).assign(read, read_value=False)
      # The start's weights are not finite (the update before this step
      # made them NaN while its own loss was finite): one step further back.
      checks = [tf2.reduce_all(tf2.math.is_finite(w)) for w in self._weights]
      if checks:
        tf2.cond(
          tf2.reduce_all(tf2.stack(checks)),
          lambda: tf2.constant(True),
          from_slot,
        )
      keeper.rolled_back(counts, local)
      return tf2.constant(False)

    decided = tf2.cond(finite, commit, roll_back)
    if keeper.replicas == 1:
      # A call runs only the branch taken; lowered, the rollback branch's
      # nodes would pass through the executor at every step (design note).
      # Not under replicas, whose branches write components on several
      # devices.
      keep_cond_as_call(decided)
    return logs


class SkipUndo(object):
  """`in_step_undo="skip"`: the update applied only when the step stands.

  Args:
    keeper: The `InStepKeeper` (its options, model, counts).
  """

  store = None  # nothing is kept

  def __init__(self, keeper):
    self._keeper = keeper
    self._restored = []  # what the step writes outside the update
    self._decider = None  # the metric logged as `monitor`

  def check(self, strategy):
    """Refuses a strategy whose update runs a `merge_call`.

    Raises:
      ValueError: Any strategy but the default one and `OneDeviceStrategy`.
    """
    if _merges_updates(strategy):
      replicas = strategy.num_replicas_in_sync
      raise ValueError(
        "SnapshotCallback(in_step_undo='skip') cannot run under %s (%d "
        "replica%s): it puts the optimizer's update under a tf.cond, and "
        "there the update aggregates the gradients across replicas (a "
        "merge_call), which TensorFlow refuses inside control flow in "
        "replica context. Use in_step_undo='copy'."
        % (type(strategy).__name__, replicas, "" if replicas == 1 else "s")
      )

  def start(self, model, strategy):
    del model, strategy
    self._decider = None
    return False

  def prepare(self, model, step, data):
    """Traces `step` in a scratch function, recording the update, and sets
    what a skipped step puts back, after checking it can be skipped.

    Skipping needs the logged `monitor` value where the update is called:
    the step must be Keras's own (its "loss" is a metric the step updates
    before the optimizer's update, and the logs are the metrics' results);
    the update must be one call of the model's optimizer, and what else the
    step writes must be variables of the model, its optimizer or its
    metrics (module doc of `engines/eager/skip_update.py`).

    Raises:
      ValueError: The step cannot be undone by skipping its update.
    """
    with skip_update.recording(model.optimizer) as update:
      graph = _scratch_trace(step, data).graph
    monitor = self._keeper.options.monitor

    def refuse(why):
      raise ValueError(
        "SnapshotCallback(in_step_undo='skip') cannot undo this train step "
        "by skipping its update: %s. Use in_step_undo='copy'." % why
      )

    own = [
      name
      for name in ("train_step", "compute_metrics", "get_metrics_result")
      if not train_step.is_keras_method(model, name)
    ]
    if own:
      refuse(
        "%s has its own %s, so the logged %r is not known where the "
        "optimizer's update is called"
        % (type(model).__name__, " and ".join(own), monitor)
      )
    late = (
      "the train step updates %r after the optimizer's update (Keras "
      "updates the compiled metrics after it, the loss before it); monitor "
      "'loss'" % (monitor,)
    )
    metrics = [m for m in model.metrics if m.name == monitor]
    if len(metrics) != 1:
      held = [  # Keras 3 holds the compiled metrics in one container
        inner
        for m in model.metrics
        for inner in getattr(m, "metrics", None) or ()
        if inner.name == monitor
      ]
      if held:
        refuse(late)
      refuse(
        "the logged %r is no metric of the model, whose results Keras logs; "
        "monitor 'loss'" % (monitor,)
      )
    calls = update.calls(graph)
    if calls != 1:
      refuse(
        "the train step calls the optimizer's apply_gradients %d times, not "
        "once" % calls
      )
    writes = skip_update.outside_writes(
      graph, update, keras_state.default_variables(model)
    )
    if writes.unknown:
      refuse(
        "ops of the train step outside the optimizer's update may write "
        "resources that are no variables of the model, its optimizer or its "
        "metrics, which a skipped step would not put back (%s)"
        % ", ".join(sorted(set(writes.unknown))[:5])
      )
    if any(
      id(keras_state.inner(v)) in writes.after for v in metrics[0].variables
    ):
      refuse(late)
    self._restored = writes.variables
    self._decider = metrics[0]

  def guarded(self, step, data):
    """The step, its update applied only when the logged value is finite.

    What the rest of the step writes (found by `prepare`) is read first,
    before anything writes it, and put back when the update was skipped;
    the decision is the `monitor` metric's result where the update is
    called, the value the logs then give.
    """
    keeper = self._keeper
    reads = [(v, v.value()) for v in self._restored]
    metric = self._decider

    def decide():
      return tf2.reduce_all(tf2.math.is_finite(metric.result()))

    with skip_update.gated(keeper.model.optimizer, decide) as gate:
      logs = step(data)
    _check_logs(logs, keeper.options.monitor)
    if gate.condition is None:
      raise ValueError(
        "SnapshotCallback(in_step=...): the train step did not call the "
        "optimizer's apply_gradients this time, though its first trace did; "
        "pass in_step_undo='copy'."
      )
    counts = keeper.counts

    def kept():
      counts.assign(counts * tf2.constant([1, 0], tf2.int64), read_value=False)
      return tf2.constant(True)

    def skipped():
      for variable, read in reads:
        variable.assign(read, read_value=False)
      keeper.rolled_back(counts, lambda v: v)
      return tf2.constant(False)

    # A call, as the copy's rollback branch (`CopyUndo.guarded`).
    keep_cond_as_call(tf2.cond(gate.condition, kept, skipped))
    return logs


# How a step is undone, by `in_step_undo`.
WAYS = {"copy": CopyUndo, "skip": SkipUndo}


def _scratch_trace(step, data):
  """The concrete function of `step` traced for `data` in a scratch
  `tf.function` that never runs: what Keras makes in the first step (the
  optimizer's slots, the compiled metrics; Keras makes variables under
  `init_scope`, so they are real) is made there. (Not under `init_scope`
  itself: that pauses gradient tapes.)"""
  specs = tf2.nest.map_structure(
    lambda t: tf2.type_spec_from_value(t) if tf2.is_tensor(t) else t, data
  )
  return tf2.function(step, autograph=False).get_concrete_function(specs)


def _merges_updates(strategy):
  """Whether an optimizer's update under `strategy` runs a `merge_call` in
  replica context: under every strategy but `OneDeviceStrategy` and the
  default one (the one in effect outside any scope; TensorFlow has no
  public test for it, but `has_strategy()` is False in its scope only)."""
  if isinstance(strategy, tf2.distribute.OneDeviceStrategy):
    return False
  with strategy.scope():
    return tf2.distribute.has_strategy()


def _check_logs(logs, monitor):
  """Raises ValueError when the step's logs have no `monitor`."""
  if not isinstance(logs, dict) or monitor not in logs:
    raise ValueError(
      "The batch logs have no %r to check (they have %s); pass monitor= "
      "one of them."
      % (monitor, sorted(logs) if isinstance(logs, dict) else logs)
    )
