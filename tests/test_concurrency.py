"""Store calls from several threads (tests/contract/threads.py), graph engine.

Threads snapshotting, restoring, evaluating and deleting on one store in
every mode, with ref and resource variables; a close while another thread
snapshots; the disk writer next to restores.
"""

from snapstore._tf import tf
from tests.contract.threads import DiskWriterTest  # noqa: F401
from tests.contract.threads import StoreThreadsTest  # noqa: F401

if __name__ == "__main__":
  tf.test.main()
