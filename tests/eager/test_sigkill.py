"""SIGKILL while a disk-mode store writes (tests/contract/kill.py), eager
engine: the spill file lists only whole snapshots, which restore bit-exactly,
and an interpreter that exits without close() finishes its queued writes."""

from tests.contract.kill import SigkillTest  # noqa: F401
