"""A snapshot of a spill file as a file source, for `store.files.load_spill`.

with open_snapshot("other_run.h5", tag=3) as source:
  source.declared()   # {key: (shape, dtype)}, before any data is read
  source.read(key)    # checksum verified
"""

from snapstore.spill import file as spill_file


class SnapshotSource(object):
  """One complete snapshot of a spill file, as a snapshot source (`snapstore.files.sources`).

  Lets `SnapshotStore.load_spill` read a snapshot of another run's file the way
  it reads a checkpoint or an `.npz`: names mapped, checked in full before any
  data is read, each array's checksum verified as it is read. Made by
  `open_snapshot`; closing it closes the file.
  """

  def __init__(self, opened, tag):
    self._file = opened
    self._tag = tag
    self._declared = opened.declared(tag)

  @property
  def where(self):
    return "Snapshot %r in %s" % (self._tag, self._file.path)

  def declared(self):
    return dict(self._declared)

  def read(self, name):
    return self._file.read_variable(self._tag, name)

  def close(self):
    self._file.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()


def open_snapshot(path, tag):
  """Opens snapshot `tag` of the spill file `path` as a `SnapshotSource`.

  Raises:
    SnapshotFileError: As for `open_spill`.
    UnknownTagError: No complete snapshot `tag` (incomplete ones are named).
  """
  opened = spill_file.open_spill(path)
  try:
    return SnapshotSource(opened, tag)
  except BaseException:
    opened.close()
    raise
