"""Host arrays that TensorFlow feeds without copying them.

A session feeds a numpy array in place only when its data is 64-byte aligned;
any other array is copied first, so restoring it costs two copies instead of
one. Eagerly, an `AssignVariableOp` fed an aligned array takes its memory
likewise (`engines/eager/copies.py`); a traced function's arguments are copied.
numpy's own allocations are only 16-byte aligned. Arrays a store allocates for
snapshot data come from here.

A fed array is never written by TF afterwards: a ResourceVariable that adopts
its buffer copies it before its first update (checked by the tests).

    out = aligned_empty((1024, 1024), np.float32)
    value = aligned_copy(array)

A file read gives the store arrays nobody else holds (`Owned`): a host mode
keeps those as they are instead of copying them, so that a snapshot loaded
from a file costs its bytes once, not twice (issue 38).
"""

import numpy as np

ALIGNMENT = 64


def aligned_empty(shape, dtype):
  """An uninitialized C-contiguous array whose data is 64-byte aligned."""
  dtype = np.dtype(dtype)
  nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  raw = np.empty(nbytes + ALIGNMENT, np.uint8)
  start = (-raw.ctypes.data) % ALIGNMENT
  return raw[start : start + nbytes].view(dtype).reshape(shape)


def aligned_copy(array, dtype=None):
  """A 64-byte aligned, C-contiguous copy of `array` (cast to `dtype` if given).

  The cast is by value, so a non-native byte order becomes the native one.
  """
  array = np.asarray(array)
  out = aligned_empty(array.shape, dtype or array.dtype.newbyteorder("="))
  out[...] = array
  return out


def is_aligned(array):
  return array.ctypes.data % ALIGNMENT == 0


class Owned(list):
  """Arrays made for the store alone (read from a file into new memory),
  which a host mode may keep without a copy (see `adoptable`)."""


def adoptable(array, dtype):
  """True if `array` can be a snapshot's array as it is: aligned,
  C-contiguous, owning its memory (no view of a larger array) and of
  `dtype` in native byte order."""
  return (
    isinstance(array, np.ndarray)
    and array.dtype == np.dtype(dtype)
    and array.dtype.isnative
    and array.flags.c_contiguous
    and is_aligned(array)
    and _sole_view(array)
  )


def _sole_view(array):
  """`array` owns its memory, or is the whole of an `aligned_empty` buffer."""
  if array.base is None:
    return True
  base = array.base
  while isinstance(base, np.ndarray) and base.base is not None:
    base = base.base
  return (
    isinstance(base, np.ndarray) and base.nbytes <= array.nbytes + ALIGNMENT
  )
