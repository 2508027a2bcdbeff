"""Peak memory per mode (tests/contract/memory.py), graph engine: a store's
snapshots, restore and file paths need what the mode holds, no more."""

from snapstore._tf import tf
from tests.contract.memory import MemoryTest  # noqa: F401
from tests.contract.memory import ReplaceTest  # noqa: F401

if __name__ == "__main__":
  tf.test.main()
