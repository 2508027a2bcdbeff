"""TensorFlow checkpoints as snapshot sources, read with TF's own checkpoint reader.

`Checkpoint(path)` opens a checkpoint that `tf.train.Saver` wrote, in the V2
format (`model.ckpt-500.index` + `.data-*` files) or the V1 format (one
file), by any process and under any scope, with `tf.train.load_checkpoint`:
its names, shapes and dtypes come from the checkpoint's index, and a tensor's
data is read only when asked for. No graph is built and no op is added: the
checkpoint's own graph (`.meta`) is never imported. It is a source for
`snapstore.files.sources.read` (see there for names and partitioned variables):

    store = snapstore.SnapshotStore(scope="net", mode="device", max_to_keep=3)
    ...
    store.files.load_checkpoint("/runs/seed_1/model.ckpt-20000", tag="seed_1",
                          allow_extra=True, session=sess)     # Adam slots skipped
    store.files.load_checkpoint("/runs/other", tag="other",         # latest in a directory
                          strip_prefix="model_2", allow_extra=True, session=sess)

`path` is what `Saver.save` returns (the V2 prefix, or the V1 file), or a
directory whose `checkpoint` state file names the latest checkpoint (as
`tf.train.latest_checkpoint` reads it). Object-based checkpoints
(`tf.train.Checkpoint`, Keras `save_weights`) load too, with a `mapping`
from their `.../.ATTRIBUTES/VARIABLE_VALUE` names; their object graph entry is
metadata and is ignored.

Limitations of TF's reader with V1 checkpoints: it cannot read a partitioned
variable stored in slices ("Sliced checkpoints are not supported"), nor
float16, uint16, bool or complex tensors ("Data type not supported"). Such a
checkpoint is reported, naming the tensor, with the fix: save it again in the
V2 format (the default since TF 1.0).
"""

import os
import re

import numpy as np

from snapstore._tf import CHECKPOINT_READ_ERRORS
from snapstore._tf import OBJECT_GRAPH_PROTO_KEY
from snapstore._tf import tf
from snapstore.core import checks
from snapstore import errors

# The files of a V2 checkpoint and the meta graph, which users pass by mistake.
_FILE_OF_CHECKPOINT = re.compile(r"^(.+)\.(index|meta|data-\d{5}-of-\d{5})$")


class Checkpoint(object):
  """A checkpoint opened for reading: names, shapes and dtypes first, data on demand.

  Args:
    path: A checkpoint prefix (V2), a checkpoint file (V1), or a directory
      with a `checkpoint` state file (its latest checkpoint).

  Raises:
    TypeError: `path` is not a string or path.
    CheckpointError: No checkpoint at `path`; a directory naming no
      checkpoint; one file of a checkpoint instead of its prefix; not a
      checkpoint (the reader's message included).
  """

  _reader = None  # __del__ / close are safe if __init__ raised

  def __init__(self, path):
    self._path = _resolve(path)
    try:
      self._reader = tf.train.load_checkpoint(self._path)
    except CHECKPOINT_READ_ERRORS as e:
      raise errors.CheckpointError(
        "%s is not a TensorFlow checkpoint snapstore can read (%s). Pass what "
        "tf.train.Saver.save returned (the checkpoint prefix)."
        % (self._path, errors.first_line(e))
      ) from e
    dtypes = self._reader.get_variable_to_dtype_map()
    self._declared = dict(
      (name, (tuple(shape), _numpy_dtype(dtypes[name])))
      for name, shape in self._reader.get_variable_to_shape_map().items()
      if name != OBJECT_GRAPH_PROTO_KEY
    )

  @property
  def where(self):
    return "Checkpoint %s" % self._path

  def declared(self):
    """`{name: (shape, numpy dtype)}` of every tensor it holds; reads no data."""
    self._check_open()
    return dict(self._declared)

  def read(self, name):
    """The tensor `name` as a numpy array.

    Raises:
      CheckpointError: The reader failed (truncated data file, a V1 sliced
        variable); the message names the tensor.
    """
    self._check_open()
    try:
      return np.asarray(self._reader.get_tensor(name))
    except CHECKPOINT_READ_ERRORS as e:
      fix = ""
      if isinstance(e, tf.errors.UnimplementedError) and "Sliced" in str(e):
        fix = (
          " It is a partitioned variable stored in slices by a V1 "
          "checkpoint, which TF's checkpoint reader cannot read; save the "
          "checkpoint again in the V2 format (the default)."
        )
      elif isinstance(e, tf.errors.UnimplementedError) and "Data type" in str(
        e
      ):
        fix = (
          " TF's checkpoint reader cannot read dtype %s from a V1 "
          "checkpoint; save the checkpoint again in the V2 format (the "
          "default)." % np.dtype(self._declared[name][1]).name
        )
      raise errors.CheckpointError(
        "Reading %r from checkpoint %s failed: %s.%s Nothing was stored."
        % (name, self._path, errors.first_line(e), fix)
      ) from e

  def object_graph(self):
    """The serialized object graph of a TF2 object-based checkpoint.

    Raises:
      CheckpointError: A name-based checkpoint (`tf.train.Saver`), which has
        none.
    """
    self._check_open()
    if not self._reader.has_tensor(OBJECT_GRAPH_PROTO_KEY):
      raise errors.CheckpointError(
        "%s is a name-based checkpoint (tf.train.Saver): it has no object "
        "graph for root= to match. Load it without root=, with strip_prefix= "
        "or mapping= if its names need it." % self._path
      )
    return self._reader.get_tensor(OBJECT_GRAPH_PROTO_KEY)

  def close(self):
    """Drops the reader. Safe to call twice."""
    self._reader = None

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()

  def _check_open(self):
    if self._reader is None:
      raise errors.CheckpointError("Checkpoint %s is closed." % self._path)


def _resolve(path):
  """The checkpoint to open for `path`, or a CheckpointError saying what is wrong."""
  path = checks.path(path, "A checkpoint path")
  if tf.io.gfile.isdir(path):
    latest = tf.train.latest_checkpoint(path)
    if latest is None:
      raise errors.CheckpointError(
        "%s is a directory with no 'checkpoint' file naming a checkpoint that "
        "exists. Pass a checkpoint prefix, e.g. %s."
        % (path, os.path.join(path, "model.ckpt-1000"))
      )
    return latest
  if _exists(path):
    match = _FILE_OF_CHECKPOINT.match(path)
    if match and _exists(match.group(1)):
      raise errors.CheckpointError(
        "%s is one file of checkpoint %s; pass the checkpoint's prefix %s, as "
        "tf.train.Saver.save returns it."
        % (path, match.group(1), match.group(1))
      )
    return path
  raise errors.CheckpointError(
    "No checkpoint at %s: neither %s.index (V2 format) nor a file %s (V1 "
    "format) exists. Pass what tf.train.Saver.save returned, or a directory "
    "holding a 'checkpoint' file." % (path, path, path)
  )


def _exists(path):
  """True if a V2 checkpoint with prefix `path` or a V1 checkpoint file exists."""
  if tf.io.gfile.exists(path + ".index"):
    return True
  try:
    return bool(tf.io.gfile.glob(path)) and not tf.io.gfile.isdir(path)
  except tf.errors.OpError:
    return False


def _numpy_dtype(dtype):
  try:
    return np.dtype(dtype.as_numpy_dtype)
  except TypeError:  # e.g. a resource or variant entry: never a store's dtype
    return dtype.name
