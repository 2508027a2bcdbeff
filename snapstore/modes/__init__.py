"""Copy modes, chosen by name: one table, and a clear error for unknown names."""
from snapstore.modes.device import DeviceMode
from snapstore.modes.host import HostMode

MODES = {
    DeviceMode.name: DeviceMode,
    HostMode.name: HostMode,
}


def get(name):
  """The copy mode class registered under `name`.

  Raises:
    ValueError: No mode has that name; the message lists the valid ones.
  """
  try:
    return MODES[name]
  except (KeyError, TypeError):
    raise ValueError("Invalid mode %r; must be one of %s."
                     % (name, ", ".join(sorted(MODES))))
