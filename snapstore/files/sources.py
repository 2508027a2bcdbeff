"""Snapshots from files: a file's names mapped onto a store's keys, checked, then read.

A snapshot can come from any file that holds one array per variable under some
name: a `tf.train.Saver` checkpoint (`snapstore.files.checkpoints.Checkpoint`), an
`.npz` archive (`snapstore.files.npz.Archive`). Each is a *source* with three members:

- `where`: how messages name it, e.g. "Checkpoint /tmp/run1/model.ckpt-500";
- `declared()`: `{name: (shape, numpy dtype)}` for every array it holds, known
  without reading any data (a checkpoint's index, the `.npy` headers);
- `read(name)`: one array, read on demand.

`read(source, varset, names)` maps the source's names to the store's keys
(`NameMap`), checks names, shapes and dtypes against the store in full (every
problem named in one error), and only then reads the arrays the store covers,
in the store's order. It stores nothing: `SnapshotStore.load_checkpoint` and
`load_npz` put the result into a snapshot with the op the store built at
construction, so loading adds no graph ops.

    names = NameMap(varset, strip_prefix="member_2")
    with checkpoints.Checkpoint("/tmp/member_2/model.ckpt-500") as source:
      arrays = read(source, varset, names)   # numpy arrays, varset.specs order

Partitioned variables: a checkpoint holds a `tf.get_variable(...,
partitioner=...)` variable whole, under the partitioned variable's name
(`net/emb`), while a store covers its parts (`emb/part_0`, ...). A part that the
source does not hold by its own key is cut from the whole array, by the part's
offset and shape, so a checkpoint loads whatever partitioning wrote it.
"""

import collections
import re

import numpy as np

from snapstore._tf import save_slice_info
from snapstore.core import buffers
from snapstore.core.varset import same_dtype
from snapstore import errors

# A part of a partitioned variable: the key of the whole, its full shape, and
# the slices that cut the part out of it.
_Part = collections.namedtuple("_Part", ["full_key", "full_shape", "slices"])

_LISTED = 10  # names listed in a hint before "..."


class NameMap(object):
  """How the names in a file become a store's keys.

  A name becomes a key as follows. If `mapping` is a dict holding the name,
  the key is `mapping[name]` (None skips the name). Otherwise a name under
  `strip_prefix` (`"<strip_prefix>/rest"`) becomes `"<add_prefix>/rest"` (or
  `"rest"` without `add_prefix`), and any other name is the key as it is, as a
  store keys a variable outside its scope (`beta1_power`, `global_step`). With
  no `strip_prefix`, every name gets `add_prefix`. If `mapping` is a function,
  it maps every name (None skips it) and replaces the prefix rules.

  Args:
    varset: The store's `VariableSet`; mapped keys are checked against it.
    strip_prefix: A scope name, or None or "" for none.
    add_prefix: A scope name, or None or "" for none.
    mapping: A dict `{name: key or None}`, or a function `name -> key or None`.

  Raises:
    TypeError: A prefix that is not a string; a mapping that is neither a dict
      nor a function, or a dict entry that is not `str -> str or None`.
    ValueError: A dict value that is not a key of the store; two dict names
      sent to one key; a function together with a prefix.
  """

  def __init__(self, varset, strip_prefix=None, add_prefix=None, mapping=None):
    self._strip = _prefix(strip_prefix, "strip_prefix")
    self._add = _prefix(add_prefix, "add_prefix")
    self._function = None
    self._dict = {}
    if callable(mapping) and not isinstance(mapping, dict):
      if self._strip or self._add:
        raise ValueError(
          "Pass a mapping function or strip_prefix/add_prefix, not both: the "
          "function maps every name (got strip_prefix=%r, add_prefix=%r)."
          % (strip_prefix, add_prefix)
        )
      self._function = mapping
    elif mapping is not None:
      self._dict = _check_mapping(mapping, varset)

  def key(self, name):
    """The key `name` maps to, or None if it is skipped."""
    if self._function is not None:
      key = self._function(name)
      if key is not None and not isinstance(key, str):
        raise TypeError(
          "The mapping function returned %r for %r; it must return "
          "a store key (a string) or None." % (key, name)
        )
      return key
    if name in self._dict:
      return self._dict[name]
    if not self._strip:
      rest = name
    elif name.startswith(self._strip + "/"):
      rest = name[len(self._strip) + 1 :]
    else:
      return name
    return self._add + "/" + rest if self._add else rest

  def keys(self, names):
    """`{key: name}` for the `names` that map to a key.

    Raises:
      ValueError: Two names map to one key.
    """
    by_key = {}
    for name in sorted(names):
      key = self.key(name)
      if key is None:
        continue
      if key in by_key:
        fix = (
          "Change the function"
          if self._function is not None
          else "Change the prefixes, or pass mapping={%r: None} (or another "
          "key) for one of them" % name
        )
        raise ValueError(
          "Names %r and %r both map to %r (with %s); a variable takes one "
          "name. %s." % (by_key[key], name, key, self, fix)
        )
      by_key[key] = name
    return by_key

  def unused(self, names):
    """Names of the mapping dict that are not among `names`, sorted."""
    return sorted(set(self._dict) - set(names))

  def __str__(self):
    if self._function is not None:
      return "mapping function %s" % getattr(self._function, "__name__", "")
    parts = []
    if self._strip:
      parts.append("strip_prefix=%r" % self._strip)
    if self._add:
      parts.append("add_prefix=%r" % self._add)
    if self._dict:
      parts.append("a mapping of %d name(s)" % len(self._dict))
    return ", ".join(parts) or "no strip_prefix, add_prefix or mapping"


def read(source, varset, names, allow_extra=False):
  """The arrays `varset` covers, read from `source` after checking it in full.

  Args:
    source: A source (see the module doc).
    varset: The store's `VariableSet`.
    names: A `NameMap` from the source's names to `varset`'s keys.
    allow_extra: Skip names that map to no variable of the store instead of
      reporting them.

  Returns:
    numpy arrays in `varset.specs` order, in native byte order, 64-byte
    aligned and held by nothing else (a `buffers.Owned` list).

  Raises:
    ValueError: Two names map to one variable.
    IncompatibleSnapshotError: Variables the source lacks, names that map to
      no variable (unless `allow_extra`), other shapes or dtypes, mapping names
      the source does not hold: all named in one message. Nothing is read.
    SnapshotFileError: Reading an array failed (a subclass per source).
  """
  held = source.declared()
  by_key = names.keys(held)
  plan, declared, problems, used = _plan(varset, held, by_key)
  extra = dict((key, name) for key, name in by_key.items() if name not in used)
  if not allow_extra:
    # Reported by their keys, which are no keys of the store.
    declared.update((key, held[name]) for key, name in extra.items())
  unused = names.unused(held)
  if unused:
    problems.append(
      "the mapping names %s, which the file does not hold" % ", ".join(unused)
    )
  varset.check_declared(
    declared,
    source.where,
    more_problems=problems,
    hint=_hint(names, sorted(extra.values()), allow_extra),
  )
  wholes = {}  # name -> array, for partitioned variables read once
  arrays = buffers.Owned()
  for spec in varset.specs:
    name, slices = plan[spec.key]
    if slices is None:
      value = _checked(source.read(name), spec, name, source)
    else:
      if name not in wholes:
        wholes[name] = source.read(name)
      value = _checked(wholes[name][slices], spec, name, source)
    # Arrays of the store's own, read one at a time: a host mode keeps them
    # as they are (`buffers.Owned`), so the file costs its bytes once.
    if not buffers.adoptable(value, spec.dtype) or slices is not None:
      value = buffers.aligned_copy(value)
    arrays.append(value)
  return arrays


def _plan(varset, held, by_key):
  """Which name (and slices) each key is read from, what is declared for it.

  Returns:
    `({key: (name, slices or None)}, {key: (shape, dtype)}, [problems],
    {names matched to a variable})`.
  """
  plan, declared, problems, used = {}, {}, [], set()
  for spec in varset.specs:
    name = by_key.get(spec.key)
    if name is not None:
      plan[spec.key] = (name, None)
      declared[spec.key] = held[name]
      used.add(name)
      continue
    part = _part(spec)
    if part is None or part.full_key not in by_key:
      continue  # reported missing by check_declared
    name = by_key[part.full_key]
    used.add(name)
    full_shape, dtype = held[name]
    declared[spec.key] = (spec.shape, dtype)
    if tuple(full_shape) != part.full_shape:
      problem = "%s has shape %s, the partitioned variable has shape %s" % (
        part.full_key,
        tuple(full_shape),
        part.full_shape,
      )
      if problem not in problems:  # once, not once per part
        problems.append(problem)
      continue
    plan[spec.key] = (name, part.slices)
  return plan, declared, problems, used


def _part(spec):
  """The `_Part` of a store variable that is a part of a partitioned variable."""
  info = save_slice_info(spec.variable)
  match = re.match(r"^(.+)/part_\d+$", spec.key)
  if info is None or match is None:
    return None
  slices = tuple(
    slice(offset, offset + size)
    for offset, size in zip(info.var_offset, info.var_shape)
  )
  return _Part(match.group(1), tuple(info.full_shape), slices)


def _checked(value, spec, name, source):
  """`value` as a native-order array, if it is what the source declared."""
  value = np.asarray(value)
  if value.shape != spec.shape or not same_dtype(value.dtype, spec.dtype):
    raise errors.SnapshotFileError(
      "%s: %r reads as %s %s, but its header says %s %s; the file is corrupt."
      % (
        source.where,
        name,
        value.dtype.name,
        value.shape,
        spec.dtype.name,
        spec.shape,
      )
    )
  if not value.dtype.isnative:
    value = value.astype(value.dtype.newbyteorder("="))
  return value


def _hint(names, extra, allow_extra):
  hint = "Names were mapped to the store's keys with %s." % names
  if extra and not allow_extra:
    hint += " allow_extra=True skips names that map to no variable."
  elif extra:
    listed = ", ".join(extra[:_LISTED]) + (
      ", ..." if len(extra) > _LISTED else ""
    )
    hint += " Skipped as mapping to no variable: %s." % listed
  return hint


def _prefix(value, what):
  if value is None:
    return ""
  if not isinstance(value, str):
    raise TypeError(
      "%s must be a string (a scope name), got %r." % (what, value)
    )
  return value.strip("/")


def _check_mapping(mapping, varset):
  if not isinstance(mapping, dict):
    raise TypeError(
      "mapping must be a dict {name in the file: store key or None} "
      "or a function, got %r." % (mapping,)
    )
  # Keys of the store, and of partitioned variables whose parts it covers.
  keys = set(varset.keys)
  keys.update(part.full_key for part in map(_part, varset.specs) if part)
  by_key = {}
  for name, key in sorted(mapping.items(), key=lambda kv: str(kv[0])):
    if not isinstance(name, str) or not (key is None or isinstance(key, str)):
      raise TypeError(
        "mapping entries must be name -> store key (strings) or "
        "None, got %r: %r." % (name, key)
      )
    if key is None:
      continue
    if key not in keys:
      raise ValueError(
        "mapping sends %r to %r, which is not a key of the store (see "
        "store.keys; keys are variable names relative to the store's scope)."
        % (name, key)
      )
    if key in by_key:
      raise ValueError(
        "mapping sends both %r and %r to variable %r; a variable takes one name."
        % (by_key[key], name, key)
      )
    by_key[key] = name
  return dict(mapping)
