"""A disk that fills up and stays full (tests/contract/full_disk.py), graph
engine: a real tmpfs (ENOSPC; skipped, saying why, where it cannot be
mounted), a file-size limit (EFBIG) and injected ENOSPC."""

import errno

from snapstore._tf import tf
from snapstore.modes import tiers
from tests.contract.full_disk import FaultInjectionTest  # noqa: F401
from tests.contract.full_disk import FileSizeLimitTest  # noqa: F401
from tests.contract.full_disk import RealFullDiskTest  # noqa: F401


class WrappedCauseTest(tf.test.TestCase):
  """Python 3.13 wraps a failed spill write in SystemError (h5py calls the
  file's flush with the write's OSError still set): the cause is still named."""

  def _wrapped(self, number, text):
    try:
      try:
        raise OSError(number, text)
      except OSError as e:
        raise SystemError(
          "<function flush> returned a result with an exception set"
        ) from e
    except SystemError as e:
      return e

  def test_a_full_disk_is_named_through_the_wrapper(self):
    error = self._wrapped(errno.ENOSPC, "No space left on device")
    self.assertTrue(tiers._is_full(error))  # pylint: disable=protected-access
    self.assertEqual(
      tiers._describe(error),  # pylint: disable=protected-access
      "no space left on the device: OSError: [Errno %d] No space left on "
      "device" % errno.ENOSPC,
    )

  def test_a_file_too_large_is_named_through_the_wrapper(self):
    error = self._wrapped(errno.EFBIG, "File too large")
    self.assertTrue(tiers._too_large(error))  # pylint: disable=protected-access
    self.assertFalse(tiers._is_full(error))  # pylint: disable=protected-access

  def test_a_system_error_of_its_own_stays_one(self):
    error = SystemError("something else")
    self.assertIs(tiers._cause(error), error)  # pylint: disable=protected-access


if __name__ == "__main__":
  tf.test.main()
