"""Store calls from several threads (tests/contract/threads.py), eager engine.

Threads snapshotting, restoring, evaluating and deleting on one store in
every mode; a close while another thread snapshots; the disk writer next to
restores.
"""

from tests.contract.threads import DiskWriterTest  # noqa: F401
from tests.contract.threads import StoreThreadsTest  # noqa: F401
