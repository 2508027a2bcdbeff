"""SIGKILL while a disk-mode store writes (tests/contract/kill.py), graph
engine: the spill file lists only whole snapshots, which restore bit-exactly,
and an interpreter that exits without close() finishes its queued writes."""

from snapstore._tf import tf
from tests.contract.kill import SigkillTest  # noqa: F401

if __name__ == "__main__":
  tf.test.main()
