"""A disk that fills up and stays full (tests/contract/full_disk.py), graph
engine: a real tmpfs (ENOSPC; skipped, saying why, where it cannot be
mounted), a file-size limit (EFBIG) and injected ENOSPC."""

from snapstore._tf import tf
from tests.contract.full_disk import FaultInjectionTest  # noqa: F401
from tests.contract.full_disk import FileSizeLimitTest  # noqa: F401
from tests.contract.full_disk import RealFullDiskTest  # noqa: F401

if __name__ == "__main__":
  tf.test.main()
