"""snapstore: in-memory snapshots of TensorFlow variables, eagerly and in graph mode.

Take a snapshot of a model's variables, roll back to it, and evaluate past
parameters next to current ones, without writing a checkpoint every step. A
store is eager or graph-mode as TensorFlow is where it is built: eager
execution on TensorFlow 2.x (`tf.function`, Keras 3 or tf-keras), or a
TF1-style graph with `tf.Session` (TensorFlow 1.15, or 2.x's `tf.compat.v1`).

    store = snapstore.SnapshotStore(var_list=model, optimizer=opt)   # eager
    tag = store.snapshot()
    store.restore(tag)

    store = snapstore.SnapshotStore(scope="net", mode="device")      # graph mode
    tag = store.snapshot(session=sess)
    ...
    store.restore(tag, session=sess)
    q_past = store.slots.past(q, slot=0)          # q from the slot's parameters, one run
    copy = snapstore.clone(q, inputs=[x], scope="copy")   # with new variables
    store.files.load_checkpoint(path, tag="run_2", allow_extra=True)   # a Saver checkpoint
    ensemble = snapstore.Ensemble(store, probs, tags=["run_1", "run_2"])
    ensemble.evaluate({x: batch}).combined  # mean probability, in one run
"""

from snapstore._version import __version__
from snapstore.core.catalog import SnapshotInfo
from snapstore.engines.graph.variables import SHADOW_VARIABLES
from snapstore.ensemble import Ensemble
from snapstore.ensemble import EnsembleResult
from snapstore.errors import CheckpointError
from snapstore.errors import CloneError
from snapstore.errors import CoordinationError
from snapstore.errors import Error
from snapstore.errors import GraphMismatchError
from snapstore.errors import IncompatibleSnapshotError
from snapstore.errors import ModeError
from snapstore.errors import NonFiniteError
from snapstore.errors import NoSessionError
from snapstore.errors import NotChiefError
from snapstore.errors import PinnedTagError
from snapstore.errors import RestoreError
from snapstore.errors import RewireError
from snapstore.errors import SessionMismatchError
from snapstore.errors import SnapshotError
from snapstore.errors import SnapshotFileError
from snapstore.errors import SpillError
from snapstore.errors import StoreClosedError
from snapstore.errors import TracedCallError
from snapstore.errors import TrialError
from snapstore.errors import UnknownTagError
from snapstore.engines.graph.clone import Clone
from snapstore.engines.graph.clone import clone
from snapstore.modes.table import MODES
from snapstore.spill.file import open_spill
from snapstore.spill.file import SpillEntry
from snapstore.store import SnapshotStore
from snapstore.training.averages import MovingAverage
from snapstore.training.averages import RunningMean
from snapstore.training.guards import Guard
from snapstore.training.guards import Trial
from snapstore.training.keras_callback import SnapshotCallback
from snapstore.training.hooks import SnapshotHook
from snapstore.training.keras_lookahead import KerasLookahead
from snapstore.training.lookahead import Lookahead
from snapstore.training.rollback_optimizer import RollbackOptimizer
from snapstore.engines.graph.in_step import create_optimizer_slots
from snapstore.engines.graph.in_step import create_slots  # deprecated

__all__ = [
  "__version__",
  "CheckpointError",
  "Clone",
  "CloneError",
  "CoordinationError",
  "Ensemble",
  "EnsembleResult",
  "Error",
  "GraphMismatchError",
  "Guard",
  "IncompatibleSnapshotError",
  "KerasLookahead",
  "Lookahead",
  "MODES",
  "ModeError",
  "MovingAverage",
  "NoSessionError",
  "NonFiniteError",
  "NotChiefError",
  "PinnedTagError",
  "RestoreError",
  "RewireError",
  "RollbackOptimizer",
  "RunningMean",
  "SessionMismatchError",
  "SHADOW_VARIABLES",
  "SnapshotCallback",
  "SnapshotError",
  "SnapshotFileError",
  "SnapshotHook",
  "SnapshotInfo",
  "SnapshotStore",
  "SpillEntry",
  "SpillError",
  "StoreClosedError",
  "TracedCallError",
  "Trial",
  "TrialError",
  "UnknownTagError",
  "clone",
  "create_optimizer_slots",
  "create_slots",
  "open_spill",
]
