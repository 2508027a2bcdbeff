"""The store's state machine (tests/contract/state_machine.py), graph engine.

Device, host and disk stores, and device and host stores with a spill file,
each with ref and resource variables, driven through random call sequences
and compared with a numpy model after every step. Each store's graph is
finalized: no call may add an op. For a longer, random search:

    SNAPSTORE_HYPOTHESIS_PROFILE=long python -m pytest tests/test_state_machine.py
"""

from snapstore._tf import tf
from tests.contract import state_machine
from tests.contract.state_machine import PinSpilledTest  # noqa: F401

globals().update(state_machine.cases())


def tearDownModule():
  state_machine.close_all()


if __name__ == "__main__":
  tf.test.main()
