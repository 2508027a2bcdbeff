"""Copy modes chosen by name: the lookup, and the checks of a mode's options.

Each engine implements every mode, under the same names and options
(`engines/graph/`, `engines/eager/`), and keeps its own table
`{name: mode class}`; these functions serve both.

mode_cls = get(engine_table, "device")         # the list of names if unknown
max_to_keep = check_max_to_keep(None, mode_cls)
check_fits(mode_cls, max_to_keep, varset)      # device slots in memory
check_options(mode_cls, {"saveable": True})
mode = build(mode_cls, varset, max_to_keep, "snapstore", {"saveable": True})
"""

import collections
import inspect
import os

from snapstore._tf import tf
from snapstore.core import checks
from snapstore.modes.slot_book import SlotBook
from snapstore.modes.tiers import TieredMode

MODES = ("device", "disk", "host")
"""The copy modes every engine implements, by the name `mode=` takes.

`SnapshotStore(mode=...)` refuses any other name, listing these. What each
keeps where: the docs' Concepts, "Copy modes".

Example:
  ```python
  assert "host" in snapstore.MODES  # ("device", "disk", "host")
  store = snapstore.SnapshotStore(var_list=model, mode="host")
  ```
"""

# Options every mode takes for a spill file under it (see modes/tiers.py).
SPILL_OPTIONS = (
  "spill_path",
  "compression",
  "compression_opts",
  "max_pending",
  "durable",
)


def get(table, name):
  """The copy mode class an engine's `table` registers under `name`.

  Raises:
    ValueError: No mode has that name; the message lists the valid ones.
  """
  try:
    return table[name]
  except (KeyError, TypeError):
    raise ValueError(
      "Invalid mode %r; must be one of %s." % (name, ", ".join(sorted(table)))
    ) from None


def options(mode_cls):
  """Names of the options `mode_cls` takes, spill options included."""
  params = inspect.signature(mode_cls.__init__).parameters
  own = [
    p for p in params if p not in ("self", "varset", "max_to_keep", "name")
  ]
  return own + [o for o in SPILL_OPTIONS if o not in own]


def check_options(mode_cls, mode_options):
  """Checks that `mode_cls` takes every option in `mode_options`.

  Raises:
    TypeError: An option the mode does not take; the message lists its options.
  """
  allowed = options(mode_cls)
  unknown = sorted(set(mode_options) - set(allowed))
  if unknown:
    raise TypeError(
      "Mode %r takes no option %s; its options are: %s."
      % (mode_cls.name, ", ".join(unknown), ", ".join(allowed) or "none")
    )


def check_max_to_keep(max_to_keep, mode_cls):
  """`max_to_keep` for a store of `mode_cls`: its default for None, None for no bound.

  Raises:
    TypeError: Not an int.
    ValueError: Below 1, or 0 for a mode that cannot keep every snapshot.
  """
  if max_to_keep is None:
    return mode_cls.default_max_to_keep
  if mode_cls.allows_unbounded:
    max_to_keep = checks.integer(
      max_to_keep, "max_to_keep", 0, hint="0 keeps every snapshot"
    )
    return max_to_keep or None
  return checks.integer(
    max_to_keep,
    "max_to_keep",
    1,
    hint="mode %r keeps at least 1 snapshot" % mode_cls.name,
  )


# What one shadow variable costs this process besides its data: its ~6 graph
# ops and their Python objects (about 41 KiB for a resource shadow, 27 KiB for
# a ref one, measured on TF 1.15 by RSS; the smaller is the floor used).
GRAPH_BYTES_PER_SHADOW = 24 << 10


def check_fits(mode_cls, max_to_keep, varset):
  """Checks that device mode's slots can exist at all, before any is built.

  Device mode allocates `max_to_keep` slots plus the scratch copy up front,
  each a full set of shadow variables: their data on the variables' devices
  and their graph ops in this process. Each task holding variables must fit
  its share, and this process the graph, within the physical memory of one
  machine: this host's RAM (`os.sysconf`) is the bound, for remote tasks too
  (the store cannot see theirs). Other modes allocate per snapshot and are
  bounded by their budgets.

  Raises:
    ValueError: The slots cannot fit; the message gives the bytes they need.
  """
  if not issubclass(mode_cls, SlotBook):
    return
  ram = _physical_memory()
  if ram is None:
    return
  copies = max_to_keep + 1  # the slots and evaluate_with's scratch
  need = collections.Counter()
  for spec in varset:
    need[_task_of(spec.variable.device)] += copies * spec.nbytes
  need[None] += copies * len(varset) * GRAPH_BYTES_PER_SHADOW
  for task, nbytes in sorted(need.items(), key=lambda kv: -kv[1]):
    if nbytes > ram:
      raise ValueError(
        "max_to_keep=%d device slots cannot fit: %d slots and the scratch copy "
        "of %d bytes of variables need %d bytes %s, more than the %d bytes of "
        "physical memory of this machine. Lower max_to_keep, or keep "
        "snapshots in host memory or on disk (mode='host' or mode='disk')."
        % (
          max_to_keep,
          max_to_keep,
          varset.nbytes,
          nbytes,
          "in this process (with their graph ops, about %d bytes per shadow "
          "variable)" % GRAPH_BYTES_PER_SHADOW
          if task is None
          else "on task %s" % task,
          ram,
        )
      )


def _task_of(device):
  """The task a device string names ("/job:ps/task:0"), or None for this process."""
  spec = tf.DeviceSpec.from_string(device or "")
  if spec.job is None or spec.job == "localhost":
    return None
  return "/job:%s/task:%s" % (
    spec.job,
    spec.task if spec.task is not None else "*",
  )


def _physical_memory():
  """This machine's RAM in bytes, or None where the OS does not say."""
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (AttributeError, ValueError, OSError):
    return None


def build(mode_cls, varset, max_to_keep, name, mode_options):
  """The mode for a store: `mode_cls`, under a spill file if one is given.

  Raises:
    ValueError: Spill options without `spill_path`.
  """
  if issubclass(mode_cls, TieredMode):
    return mode_cls(varset, max_to_keep, name, **mode_options)
  spill_options = dict(
    (k, mode_options[k]) for k in SPILL_OPTIONS if k in mode_options
  )
  own = dict((k, v) for k, v in mode_options.items() if k not in spill_options)
  if spill_options and spill_options.get("spill_path") is None:
    raise ValueError(
      "%s only apply to a spill file; pass spill_path= as well."
      % ", ".join(sorted(spill_options))
    )
  inner = mode_cls(varset, max_to_keep, name, **own)
  if not spill_options:
    return inner
  try:
    return TieredMode(inner, varset, **spill_options)
  except BaseException:
    inner.close()
    raise
