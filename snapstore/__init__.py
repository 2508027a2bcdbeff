"""snapstore: in-memory snapshots of TensorFlow 1.15 variables.

Take a snapshot of a model's variables, roll back to it, and evaluate past
parameters next to current ones, without writing a checkpoint every step.

    store = snapstore.SnapshotStore(scope="net", mode="device")
    tag = store.snapshot(session=sess)
    ...
    store.restore(tag, session=sess)
"""
from snapstore._version import __version__
from snapstore.errors import Error
from snapstore.errors import GraphMismatchError
from snapstore.errors import IncompatibleSnapshotError
from snapstore.errors import ModeError
from snapstore.errors import NoSessionError
from snapstore.errors import RestoreError
from snapstore.errors import SnapshotError
from snapstore.errors import SnapshotFileError
from snapstore.errors import SpillError
from snapstore.errors import UnknownTagError
from snapstore.modes import MODES
from snapstore.spill import open_spill
from snapstore.spill import SpillEntry
from snapstore.store import SnapshotInfo
from snapstore.store import SnapshotStore
from snapstore.variables import SHADOW_VARIABLES

__all__ = [
    "__version__",
    "Error",
    "GraphMismatchError",
    "IncompatibleSnapshotError",
    "MODES",
    "ModeError",
    "NoSessionError",
    "RestoreError",
    "SHADOW_VARIABLES",
    "SnapshotError",
    "SnapshotFileError",
    "SnapshotInfo",
    "SnapshotStore",
    "SpillEntry",
    "SpillError",
    "UnknownTagError",
    "open_spill",
]
