"""Peak memory per mode (tests/contract/memory.py), eager engine: a store's
snapshots, restore and file paths need what the mode holds, no more."""

from tests.contract.memory import MemoryTest  # noqa: F401
from tests.contract.memory import ReplaceTest  # noqa: F401
