"""Argument checks, each written once, with the messages every caller shares.

Checks of plain Python values (no TensorFlow), and the one check that an
object belongs to a store's graph.
"""

import os

import numpy as np

from snapstore import errors


def integer(value, name, minimum, maximum=None, hint=None):
  """`value` as an int, if it is an int (not a bool) in [`minimum`, `maximum`].

  Args:
    value: The argument.
    name: Its name, for messages.
    minimum: The smallest value allowed.
    maximum: The largest value allowed, or None for no bound.
    hint: A phrase added to the message of a value out of range, in
      parentheses: what the bounds mean.

  Raises:
    TypeError: Not an int.
    ValueError: Out of range.
  """
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise TypeError("%s must be an int, got %r." % (name, value))
  bound = None
  if value < minimum:
    bound = ">= %d" % minimum
  elif maximum is not None and value > maximum:
    bound = "<= %d" % maximum
  if bound:
    raise ValueError(
      "%s must be %s%s, got %d."
      % (name, bound, " (%s)" % hint if hint else "", value)
    )
  return int(value)


def number(value, name):
  """`value` as a float, if it is a real number (not a bool).

  Raises:
    TypeError: Not a number.
  """
  if isinstance(value, bool) or not isinstance(
    value, (int, float, np.integer, np.floating)
  ):
    raise TypeError("%s must be a number, got %r." % (name, value))
  return float(value)


def tag(value):
  """`value` as a snapshot tag: an int (a numpy integer becomes one) or a non-empty str.

  A string tag must be encodable as UTF-8: spill files and `.npz` archives
  store tags as UTF-8, and a tag that cannot be written there could never
  leave the store.

  Raises:
    TypeError: Anything else (None, a bool, an empty string, a string with a
      lone surrogate, ...).
  """
  if isinstance(value, np.integer):
    value = int(value)
  if (
    isinstance(value, bool) or not isinstance(value, (int, str)) or value == ""
  ):
    raise TypeError(
      "A tag must be an int or a non-empty string, got %r." % (value,)
    )
  if isinstance(value, str):
    try:
      value.encode("utf-8")
    except UnicodeEncodeError as e:
      raise TypeError(
        "The tag %r cannot be encoded as UTF-8 (%s), so it could never be "
        "written to a spill file: a lone surrogate, as os.fsdecode() makes "
        "of bytes that are not UTF-8. Decode such bytes yourself (e.g. "
        "name.decode('utf-8', 'replace')) or choose another tag."
        % (value, e.reason)
      ) from None
  return value


def path(value, what):
  """`value` as a path string, if it is a non-empty string or `os.PathLike`.

  Args:
    value: The argument.
    what: How messages name it, e.g. "A checkpoint path".

  Raises:
    TypeError: Neither a string nor `os.PathLike` (None, bytes, ...).
    ValueError: An empty path.
  """
  if isinstance(value, os.PathLike):
    value = os.fspath(value)
  if not isinstance(value, str):
    raise TypeError(
      "%s must be a string or os.PathLike, got %r." % (what, value)
    )
  if not value:
    raise ValueError("%s must not be empty." % what)
  return value


def file_path(value, what):
  """`value` as the path of a file: a non-empty path that is not a directory.

  Args:
    value: The argument.
    what: How messages name it, e.g. "spill_path".

  Raises:
    TypeError: Neither a string nor `os.PathLike`.
    ValueError: An empty path, or an existing directory.
  """
  value = path(value, what)
  if os.path.isdir(value):
    raise ValueError(
      "%s %r is a directory; name a file (in it, e.g. %r)."
      % (what, value, os.path.join(value, "snapshot"))
    )
  return value


def readable_file(value, what):
  """`value` as the path of an existing file to read.

  Args:
    value: The argument.
    what: How messages name it, e.g. "A spill file".

  Raises:
    TypeError, ValueError: As for `file_path`.
    SnapshotFileError: Nothing exists at the path, or it is not a regular file.
  """
  value = file_path(value, what)
  if not os.path.exists(value):
    raise errors.SnapshotFileError("Cannot read %s: no such file." % value)
  if not os.path.isfile(value):
    raise errors.SnapshotFileError(
      "Cannot read %s: it is not a regular file (a device, pipe or socket); "
      "name a file." % value
    )
  return value


def replaceable_file(value, what):
  """`value` as the path of a file that a new file may be renamed over.

  Only a regular file is replaced: a symbolic link or a device node would be
  replaced by a regular file, not written through.

  Args:
    value: The argument.
    what: How messages name it, e.g. "The .npz path".

  Raises:
    TypeError, ValueError: As for `file_path`.
    SnapshotFileError: The path is a symbolic link or not a regular file.
  """
  value = file_path(value, what)
  if os.path.islink(value):
    raise errors.SnapshotFileError(
      "Refusing to write %s: it is a symbolic link, which writing would "
      "replace with a file. Write to the file it names (%s) or another path."
      % (value, os.path.realpath(value))
    )
  if os.path.lexists(value) and not os.path.isfile(value):
    raise errors.SnapshotFileError(
      "Refusing to write %s: it is not a regular file (a device, pipe or "
      "socket), which writing would replace. Choose another path." % value
    )
  return value


def function(value, name):
  """Checks `value` is None or callable.

  Raises:
    TypeError: Neither.
  """
  if value is not None and not callable(value):
    raise TypeError("%s must be a function, got %r." % (name, value))
  return value


def same_graph(obj, graph, what, than="the store's variables", fix=None):
  """Checks that `obj` (a tensor, op, variable, session or store) is of `graph`.

  A store, like a Sonnet module, is bound to the graph of its variables; this
  is the one check of that rule.

  Args:
    obj: Anything with a `graph` attribute.
    graph: The graph it must belong to.
    what: How the message names `obj`, e.g. "The loss loss:0".
    than: How the message names what owns `graph`.
    fix: A sentence saying how to put it right, added to the message.

  Raises:
    GraphMismatchError: `obj.graph` is another graph.
  """
  if obj.graph is not graph:
    raise errors.GraphMismatchError(
      "%s belongs to another graph than %s.%s"
      % (what, than, " " + fix if fix else "")
    )


def name(value):
  """A store's name on the eager engine (graph mode's name scope checks its own).

  Raises:
    ValueError: Not a non-empty string of letters, digits and `_.-/`.
  """
  if (
    not isinstance(value, str)
    or not value.strip("/")
    or not all(c.isalnum() or c in "_.-/" for c in value)
  ):
    raise ValueError(
      "name must be a non-empty string of letters, digits and '_.-/', got "
      "%r." % (value,)
    )
  return value.strip("/")


def same_count(what, got, store_name, want):
  """Refuses a list of `got` variables for a store over `want` of them.

  Raises:
    IncompatibleSnapshotError: `got != want`.
  """
  if got != want:
    raise errors.IncompatibleSnapshotError(
      "%s() got a list of %d variables; store %r covers %d (store.keys "
      "lists them, in the order the list is matched in)."
      % (what, got, store_name, want)
    )
