"""The variables a store covers: each one's key, shape and dtype, in the store's order.

Both engines resolve what a user passes (a scope, a collection, a list, a
`{key: variable}` dict, a Keras model, an optimizer) into `(key, variable)`
pairs in their own way (`engines/graph/variables.py`,
`engines/eager/variables.py`); a `VariableSet` is the result: validated
(fully defined shapes, supported dtypes, one key per variable, one graph),
in the order of the pairs: the order the user's objects give (a list's, a
dict's, a model's `model.weights` then its other state, then an
optimizer's), so that the same program gives the same order every run and
`zip(store.keys, model.get_weights())` pairs each key with its own weight.

    varset = VariableSet([("dense/kernel", w), ("dense/bias", b)], "var_list")
    varset.keys   # ('dense/kernel', 'dense/bias')
    varset.key_of(w, 'store')   # 'dense/kernel'
    varset.check_declared({"dense/bias": ((2,), np.float32)}, "model.npz")
"""

import collections
import difflib

import numpy as np

from snapstore._tf import tf
from snapstore import errors
from snapstore.core import distributed

_SUPPORTED_DTYPES = (
  tf.float16,
  tf.float32,
  tf.float64,
  tf.int8,
  tf.int16,
  tf.int32,
  tf.int64,
  tf.uint8,
  tf.uint16,
  tf.bool,
  tf.complex64,
  tf.complex128,
)


class VariableSpec(
  collections.namedtuple("VariableSpec", ["key", "variable", "shape", "dtype"])
):
  """One covered variable: its key, the variable, static shape and numpy dtype."""

  __slots__ = ()

  @property
  def nbytes(self):
    return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


class VariableSet(object):
  """An ordered, validated set of variables, keyed.

  Args:
    pairs: `(key, variable)` pairs, in the store's order; a None key is the
      variable's op name, relative to `scope` when it is under it. A
      variable given twice is kept once, under its first key.
    source: How messages name where the pairs came from ("var_list", "the
      model"...).
    scope: The scope keys are relative to, or None.
    origins: `{id(variable): object}`: the object the user holds for a
      variable, where it is not the variable itself (a Keras 3
      `keras.Variable` wrapping the `tf.Variable`).

  Raises:
    ValueError: No variables; a shape that is not fully defined or an
      unsupported dtype; two variables with one key; variables of several
      graphs.
  """

  def __init__(self, pairs, source, scope=None, origins=None):
    self._prefix = scope
    self._specs = _make_specs(pairs, source, scope)
    self._graph = _graph_of(self._specs[0].variable)
    self._by_key = {spec.key: spec for spec in self._specs}
    origins = origins or {}
    self._origins = dict(
      (spec.key, origins.get(id(spec.variable), spec.variable))
      for spec in self._specs
    )
    # id(what a user may hold of a variable) -> its key: the variable, the
    # object wrapping it, and a distributed variable's components.
    self._keys_by_id = {}
    for spec in self._specs:
      for obj in [self._origins[spec.key], spec.variable] + list(
        distributed.components(spec.variable)
      ):
        self._keys_by_id.setdefault(id(obj), spec.key)

  # -- public accessors ---------------------------------------------------------

  @property
  def graph(self):
    return self._graph

  @property
  def scope(self):
    """The scope keys are relative to, or None."""
    return self._prefix

  @property
  def specs(self):
    """Tuple of `VariableSpec`, in the store's order (module doc)."""
    return self._specs

  @property
  def keys(self):
    return tuple(spec.key for spec in self._specs)

  @property
  def variables(self):
    return tuple(spec.variable for spec in self._specs)

  @property
  def nbytes(self):
    """Bytes of one copy of every covered variable."""
    return sum(spec.nbytes for spec in self._specs)

  def __len__(self):
    return len(self._specs)

  def __iter__(self):
    return iter(self._specs)

  def __getitem__(self, key):
    return self._by_key[key]

  def origin(self, key, store_name):
    """The object the user holds for the variable of `key` (module doc).

    Raises:
      KeyError: No variable has key `key`; the message names close ones.
    """
    if key not in self._origins:
      close = difflib.get_close_matches(str(key), self.keys, n=3, cutoff=0.5)
      raise KeyError(
        "Store %r has no key %r. %s"
        % (
          store_name,
          key,
          "Did you mean %s?" % " or ".join(repr(k) for k in close)
          if close
          else "Its keys: %s." % errors.names(list(self.keys)),
        )
      )
    return self._origins[key]

  def key_of(self, obj, store_name):
    """The key of `obj`: a covered variable, the object the user holds for
    it, or one of its components.

    Raises:
      ValueError: `obj` is none of them.
    """
    key = self._keys_by_id.get(id(obj))
    if key is None:
      name = getattr(obj, "path", None) or getattr(obj, "name", None)
      raise ValueError(
        "Store %r does not cover %s. It covers %d variables; store.keys "
        "lists their keys."
        % (
          store_name,
          "%s %r" % (type(obj).__name__, name) if name else repr(obj),
          len(self._specs),
        )
      )
    return key

  def check_declared(self, declared, source, more_problems=(), hint=None):
    """Checks names, shapes and dtypes of arrays against the covered variables.

    Args:
      declared: A mapping from key to `(shape, numpy dtype)`, e.g. read from the
        headers of a file before any data is loaded.
      source: How to name the arrays' origin in the message, e.g. a file path.
      more_problems: Problems the caller found itself (e.g. while mapping a
        file's names to keys), reported after these in the same message.
      hint: A sentence added to the message when it is raised.

    Raises:
      IncompatibleSnapshotError: listing every missing and unexpected key and
        every shape and dtype mismatch.
    """
    problems = []
    missing = [k for k in self.keys if k not in declared]
    extra = sorted(str(k) for k in declared if k not in self._by_key)
    if missing:
      problems.append("missing variables: %s" % ", ".join(missing))
    if extra:
      problems.append(
        "variables the store does not have: %s" % errors.names(extra)
      )
    for spec in self._specs:
      if spec.key not in declared:
        continue
      shape, dtype = declared[spec.key]
      if tuple(shape) != spec.shape:
        problems.append(
          "%s has shape %s, the variable has shape %s"
          % (spec.key, tuple(shape), spec.shape)
        )
      if not same_dtype(dtype, spec.dtype):
        problems.append(
          "%s has dtype %s, the variable has dtype %s"
          % (
            spec.key,
            np.dtype(dtype).name if _is_dtype(dtype) else dtype,
            spec.dtype.name,
          )
        )
    problems.extend(more_problems)
    if problems:
      raise errors.IncompatibleSnapshotError(
        "%s does not match the store's variables: %s.%s"
        % (source, "; ".join(problems), " " + hint if hint else "")
      )


def _make_specs(pairs, source, prefix):
  seen = set()
  specs = []
  by_key = {}
  for explicit_key, var in pairs:
    if id(var) in seen:
      continue
    seen.add(id(var))
    key = explicit_key or _key_of(var, prefix)
    if key in by_key:
      raise ValueError(
        "Variables %s and %s both map to key %r. Pass a dict var_list to "
        "name them, or a scope that tells them apart."
        % (by_key[key].name, var.name, key)
      )
    by_key[key] = var
    specs.append(_spec(key, var))
  if not specs:
    hint = (
      "Build the model before the store"
      if source != "var_list"
      else "Pass at least one variable"
    )
    raise ValueError(
      "No variables to snapshot: %s is empty. %s." % (source, hint)
    )
  graphs = set(id(_graph_of(s.variable)) for s in specs)
  if len(graphs) > 1:
    raise ValueError(
      "The variables belong to %d different graphs; a store "
      "covers variables of one graph." % len(graphs)
    )
  return tuple(specs)


def _key_of(var, prefix):
  """`var`'s op name, relative to `prefix` if it is under it."""
  name = op_name(var)
  if prefix is not None and name.startswith(prefix + "/"):
    return name[len(prefix) + 1 :]
  return name


def op_name(variable):
  """The name of `variable`'s op; a distributed variable's first component's.

  A sync-on-read variable's `op` is, in TF 2.x graph mode, the op of the
  aggregate read (an "Identity"), not a variable's.
  """
  return distributed.anchor(variable).op.name


def _graph_of(variable):
  """The graph of a graph-mode variable; None for an eager one."""
  try:
    # A component's: a sync-on-read variable's own `graph` is looked up on
    # its cross-replica read, a collective under a multi-worker strategy.
    return distributed.anchor(variable).graph
  except AttributeError:  # "Tensor.graph is undefined when eager execution..."
    return None


def same_dtype(a, b):
  """True if numpy dtypes `a` and `b` hold the same values (any byte order)."""
  try:
    a, b = np.dtype(a), np.dtype(b)
  except TypeError:
    return False
  return a.newbyteorder("=") == b.newbyteorder("=") and a.kind == b.kind


def _is_dtype(x):
  try:
    np.dtype(x)
    return True
  except TypeError:
    return False


def _spec(key, var):
  if not var.shape.is_fully_defined():
    raise ValueError(
      "Variable %s has shape %s, which is not fully defined; snapstore needs "
      "static shapes (create it with a known shape, or validate_shape=True)."
      % (var.name, var.shape)
    )
  dtype = var.dtype.base_dtype
  if dtype not in _SUPPORTED_DTYPES:
    raise ValueError(
      "Variable %s has dtype %s, which snapstore does not support. Supported: "
      "%s."
      % (var.name, dtype.name, ", ".join(d.name for d in _SUPPORTED_DTYPES))
    )
  return VariableSpec(
    key, var, tuple(var.shape.as_list()), np.dtype(dtype.as_numpy_dtype)
  )
