"""A disk that fills up and stays full (tests/contract/full_disk.py), eager
engine: a real tmpfs (ENOSPC; skipped, saying why, where it cannot be
mounted), a file-size limit (EFBIG) and injected ENOSPC."""

from tests.contract.full_disk import FaultInjectionTest  # noqa: F401
from tests.contract.full_disk import FileSizeLimitTest  # noqa: F401
from tests.contract.full_disk import RealFullDiskTest  # noqa: F401
