"""The store's state machine (tests/contract/state_machine.py), eager engine.

Device, host and disk stores, and device and host stores with a spill file,
over eager variables, driven through random call sequences and compared with
a numpy model after every step. For a longer, random search:

    SNAPSTORE_TEST_ENGINE=eager SNAPSTORE_HYPOTHESIS_PROFILE=long \
      python -m pytest tests/eager/test_state_machine.py
"""

from tests.contract import state_machine
from tests.contract.state_machine import PinSpilledTest  # noqa: F401

globals().update(state_machine.cases())


def tearDownModule():
  state_machine.close_all()
