"""Ensembles: a model's outputs for several snapshots of its parameters, combined.

The members of an ensemble are snapshots of one store: separately trained
checkpoints loaded with `store.files.load_checkpoint`, `.npz` archives loaded
with `store.files.load_npz`, or snapshots taken during training. `Ensemble` evaluates the
model's outputs with each member's parameters and combines them:

    x = tf.placeholder(tf.float32, [None, 20])
    with tf.variable_scope("net"):
      logits = tf.layers.dense(tf.layers.dense(x, 64, tf.nn.relu), 4)
    store = snapstore.SnapshotStore(scope="net", mode="device", max_to_keep=3)
    ensemble = snapstore.Ensemble(
        store, {"probs": tf.nn.softmax(logits), "label": tf.argmax(logits, 1)},
        tags=["a", "b", "c"], combine={"probs": "mean", "label": "vote"})
    with tf.Session() as sess:
      sess.run(tf.local_variables_initializer())
      for tag, path in zip(["a", "b", "c"], checkpoint_paths):
        store.files.load_checkpoint(path, tag=tag, allow_extra=True,
                                    session=sess)
      result = ensemble.evaluate({x: batch}, session=sess)
      result.combined["label"]       # majority vote of the three members
      result.members["b"]["probs"]   # member b's own probabilities

How the members run:

- Device store (`mode="device"`): when the ensemble is built, its outputs are
  rewired to every device slot of the store (`store.slots.past(outputs, slot)`,
  built once and cached by the store). `evaluate` then runs every member held
  in a slot in one `session.run`, each copy reading its slot's shadows. The
  live variables are neither written nor read for the covered parameters.
- Otherwise (a host store, `rewire=False`, or a fetch that has no rewired
  copy): one member after another with `store.evaluate_with`, which loads the
  member, runs the outputs and writes the live parameters back bit for bit.

Memory: a device ensemble of N members holds N x `store.param_nbytes` on the
variables' devices, in the store's slots (`ensemble.device_nbytes`; the
store's own `nbytes` counts every slot), and its one run keeps the
activations of N forward passes alive at once. A host ensemble holds its
members in host memory (`ensemble.host_nbytes`) and streams them through the
live variables one at a time: no device memory beyond the model's own.

Combining, over the members in tag order, per output:

- "mean": the elementwise mean (`np.mean(axis=0)`).
- "vote": the majority vote of class labels. An integer output is a label;
  a floating output holds class scores (logits or probabilities) on its last
  axis, and each member's label is their argmax. Ties go to the lowest label.
  The result is int64.
- A function of one array `[member, ...]` (the members' values stacked),
  e.g. `lambda s: np.median(s, axis=0)`.

`combine` is one of these for every output, or a structure like `outputs`
with one per output.
"""

import collections

import numpy as np

from snapstore._tf import tf
from snapstore.core import checks
from snapstore import errors


class EnsembleResult(
  collections.namedtuple("EnsembleResult", ["combined", "members"])
):
  """What `Ensemble.evaluate` returns.

  Attributes:
    combined: The combined outputs, in the structure of the ensemble's outputs.
    members: An OrderedDict from member tag to that member's outputs, as
      `Session.run` returns them.

  Example:
    ```python
    result = ensemble.evaluate({x: batch}, session=sess)
    result.combined["label"]  # the members' majority vote
    result.members["run_2"]["probs"]  # one member's own outputs
    ```
  """

  __slots__ = ()


def mean(stacked):
  """The elementwise mean over members of `stacked` (`[member, ...]`)."""
  return np.mean(stacked, axis=0)


def vote(stacked):
  """The majority vote over members of `stacked` (`[member, ...]`).

  Integer (or bool) values are class labels; floating values are class scores
  on the last axis, whose argmax is the member's label. Ties go to the lowest
  label.

  Returns:
    int64 labels, of the shape of one member's labels.

  Raises:
    ValueError: Scores without a class axis, negative labels, or values that
      are neither integers nor floats.
  """
  stacked = np.asarray(stacked)
  if stacked.dtype.kind == "f":
    if stacked.ndim < 2:
      raise ValueError(
        "vote needs class labels (integers) or class scores with a class "
        "axis; got one float per member. Vote on tf.argmax(scores, -1) or "
        "scores of shape [..., classes]."
      )
    labels, classes = stacked.argmax(axis=-1), stacked.shape[-1]
  elif stacked.dtype.kind in "iub":
    labels = stacked.astype(np.int64)
    if labels.size and labels.min() < 0:
      raise ValueError("vote needs class labels >= 0, got %d." % labels.min())
    classes = int(labels.max()) + 1 if labels.size else 1
  else:
    raise ValueError(
      "vote needs integer labels or float scores, got dtype %s."
      % stacked.dtype.name
    )
  flat = labels.reshape(labels.shape[0], -1)  # [member, position]
  counts = np.zeros((flat.shape[1], classes), np.int64)
  np.add.at(
    counts, (np.broadcast_to(np.arange(flat.shape[1]), flat.shape), flat), 1
  )
  return counts.argmax(axis=1).reshape(labels.shape[1:])


_COMBINERS = collections.OrderedDict([("mean", mean), ("vote", vote)])


class Ensemble(object):
  """The outputs of one model for several snapshots of a store, combined.

  See the module doc for how members run and what memory they take. Build it
  with the graph (it builds the rewired copies); `evaluate` adds no ops.

  Args:
    store: The `SnapshotStore` whose snapshots are the members.
    outputs: A tensor, or a list, tuple or dict of tensors, of the model
      the store covers.
    tags: The members' tags, in order; they must be held by the store when
      `evaluate` runs. Default: every snapshot the store holds then, oldest
      first.
    combine: "mean", "vote", a function of the stacked member values, or a
      structure like `outputs` with one of these per output.
    rewire: Build the rewired copies that run device members in one
      `session.run`. Default: True for a device store with a shadow per
      variable, False otherwise (a host or disk store, or `pack=True`).
      False evaluates one member at a time, also on a device store (less
      activation memory, one run per member).

  Raises:
    TypeError: Outputs that are not tensors; an unknown kind of `combine`;
      a tag that is not an int or a non-empty string.
    ValueError: No outputs; `combine` not shaped like `outputs`, an unknown
      combine name (the valid ones are listed), "vote" on an output that
      holds no labels or scores; empty or repeated tags.
    GraphMismatchError: Outputs of another graph than the store's.
    ModeError: `rewire=True` on a store that is not in device mode, or
      packs its variables (`pack=True`).
    RewireError: The outputs cannot be rewired (the message names the op);
      pass `rewire=False` to evaluate the members one after another.

  Example:
    Graph mode: three checkpoints, every member in one `session.run`.

    ```python
    store = snapstore.SnapshotStore(scope="net", mode="device", max_to_keep=3)
    ensemble = snapstore.Ensemble(
      store, {"probs": tf.nn.softmax(logits)}, tags=["a", "b", "c"]
    )
    with tf.Session() as sess:
      sess.run(tf.local_variables_initializer())
      for tag in ["a", "b", "c"]:
        store.files.load_checkpoint("runs/" + tag, tag=tag, allow_extra=True)
      result = ensemble.evaluate({x: batch}, session=sess)
      mean_probs = result.combined["probs"]
    ```
  """

  def __init__(self, store, outputs, tags=None, combine="mean", rewire=None):
    if store.graph is None:
      raise errors.ModeError(
        "snapstore.Ensemble runs graph tensors in one session.run; this store "
        "is eager. Evaluate the members with store.evaluate_each(lambda: "
        "model(x).numpy(), tags=tags) and combine the results (e.g. "
        "np.mean(list(results.values()), axis=0))."
      )
    leaves = _check_outputs(outputs, store.graph)
    self._store = store
    self._outputs = outputs
    self._combiners = _combiners(combine, outputs, leaves)
    self._tags = None if tags is None else _check_tags(tags)
    try:
      slots = store.slots
    except errors.ModeError as e:
      slots, no_slots = None, e
    if rewire is None:  # rewire where every variable has a shadow to read
      rewire = slots is not None and slots.per_variable
    if rewire:
      if slots is None:
        raise errors.ModeError(
          "Ensemble(rewire=True) runs the members from device slots. %s Or "
          "pass rewire=False." % no_slots
        )
      try:
        for slot in range(len(slots)):
          slots.past(outputs, slot)
      except errors.ModeError as e:  # a packed store has no shadow per variable
        raise errors.ModeError(
          "%s Or pass Ensemble(..., rewire=False) to evaluate the members "
          "one after another, swapping them into the variables." % e
        ) from e
      except errors.RewireError as e:
        raise errors.RewireError(
          "%s Ensemble(..., rewire=False) evaluates the members one after "
          "another that way." % e
        ) from e
    self._rewire = bool(rewire)

  @property
  def store(self):
    return self._store

  @property
  def outputs(self):
    return self._outputs

  @property
  def tags(self):
    """The members' tags as given, or None for every snapshot of the store."""
    return None if self._tags is None else list(self._tags)

  @property
  def rewired(self):
    """Whether members held in device slots run together in one `session.run`."""
    return self._rewire

  @property
  def device_nbytes(self):
    """Device bytes the members take: `store.param_nbytes` per member in a slot.

    Counts the members the store holds now, by where each is (`store.files.tier`):
    members in device slots take device memory; the others take none while
    not evaluated.
    """
    return self._nbytes_in("device")

  @property
  def host_nbytes(self):
    """Host bytes the members take: `store.param_nbytes` per member in memory.

    Members of a host store, and those of a disk store (or a store with a
    spill file) that are in host memory; members in a spill file take none.
    """
    return self._nbytes_in("host")

  def evaluate(self, feed_dict=None, session=None):
    """Evaluates the outputs with every member's parameters and combines them.

    Members held in device slots run together in one `session.run` of their
    rewired copies; the others run one after another through
    `store.evaluate_with`. Either way the live parameters are left exactly as
    they were, and no op is added.

    Args:
      feed_dict: As for `Session.run`; fed to every member.
      session: The session to run in; default: the default session.

    Returns:
      An `EnsembleResult(combined, members)`.

    Raises:
      UnknownTagError: A member the store does not hold (or no snapshots at
        all with `tags=None`).
      NoSessionError, GraphMismatchError: As for the store's calls.
      ValueError: "vote" on values that are not labels or scores.
      tf.errors.OpError: Whatever `Session.run` raises for the outputs.
    """
    if self._tags is None and not self._store.tags():
      raise errors.UnknownTagError(
        "The ensemble's store holds no snapshots yet; load the members with "
        "store.files.load_checkpoint / load_npz, or take snapshots, first."
      )
    members = self._store.evaluate_each(
      self._outputs,
      feed_dict,
      tags=self._tags,
      together=self._rewire,
      session=session,
    )
    return EnsembleResult(self._combine(list(members.values())), members)

  def __repr__(self):
    return "<Ensemble of %s in store %r, %s>" % (
      "every snapshot"
      if self._tags is None
      else "%d members" % len(self._tags),
      self._store.name,
      "one run" if self._rewire else "one member at a time",
    )

  # -- internals -------------------------------------------------------------------

  def _nbytes_in(self, tier):
    held = self._store.tags()
    members = (
      held if self._tags is None else [t for t in self._tags if t in held]
    )
    return sum(
      self._store.param_nbytes for t in members if self._tier(t) == tier
    )

  def _tier(self, tag):
    try:
      return self._store.files.tier(tag)
    except errors.UnknownTagError:  # deleted by another thread meanwhile
      return None

  def _combine(self, member_values):
    flat = [tf.nest.flatten(v) for v in member_values]
    combined = []
    for i, fn in enumerate(self._combiners):
      combined.append(fn(np.stack([np.asarray(f[i]) for f in flat])))
    return tf.nest.pack_sequence_as(self._outputs, combined)


def _check_outputs(outputs, graph):
  leaves = tf.nest.flatten(outputs)
  if not leaves:
    raise ValueError("An Ensemble needs at least one output tensor.")
  for t in leaves:
    if not isinstance(t, tf.Tensor):
      raise TypeError(
        "Ensemble outputs must be tensors (or a list, tuple or dict of "
        "them), got %r." % (t,)
      )
    checks.same_graph(t, graph, "Ensemble output %s" % t.name)
  return leaves


def _combiners(combine, outputs, leaves):
  """One combine function per output leaf."""
  if isinstance(combine, str) or callable(combine):
    specs = [combine] * len(leaves)
  else:
    try:
      tf.nest.assert_same_structure(outputs, combine)
    except (ValueError, TypeError) as e:
      raise ValueError(
        "combine must be 'mean', 'vote', a function, or a structure like "
        "outputs with one of these per output: %s" % e
      )
    specs = tf.nest.flatten(combine)
  functions = []
  for spec, t in zip(specs, leaves):
    if isinstance(spec, str):
      if spec not in _COMBINERS:
        raise ValueError(
          "Invalid combine %r; must be one of %s, or a function."
          % (spec, ", ".join(_COMBINERS))
        )
      if spec == "vote":
        _check_votable(t)
      functions.append(_COMBINERS[spec])
    elif callable(spec):
      functions.append(spec)
    else:
      raise TypeError(
        "combine must be 'mean', 'vote' or a function, got %r." % (spec,)
      )
  return functions


def _check_votable(t):
  dtype = t.dtype.base_dtype
  if not (dtype.is_integer or dtype.is_floating or dtype == tf.bool):
    raise ValueError(
      "combine='vote' needs integer labels or float scores; %s "
      "has dtype %s." % (t.name, dtype.name)
    )
  if dtype.is_floating and t.shape.ndims == 0:
    raise ValueError(
      "combine='vote' on %s: a float scalar holds no class scores. Vote on "
      "labels (tf.argmax(scores, -1)) or on scores of shape [..., classes]."
      % t.name
    )


def _check_tags(tags):
  if isinstance(tags, (str, int)) or not hasattr(tags, "__iter__"):
    raise TypeError("tags must be a list of tags, got %r." % (tags,))
  tags = list(tags)
  if any(t is None for t in tags):
    raise TypeError(
      "tags must be ints or non-empty strings, got None in %r." % (tags,)
    )
  tags = [checks.tag(t) for t in tags]
  if not tags:
    raise ValueError(
      "An Ensemble needs at least one member; tags is empty "
      "(pass tags=None for every snapshot of the store)."
    )
  repeated = sorted(set(repr(t) for t in tags if tags.count(t) > 1))
  if repeated:
    raise ValueError(
      "tags names %s more than once; each member is one "
      "snapshot." % ", ".join(repeated)
    )
  return tags
