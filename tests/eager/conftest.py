"""Eager runs see two logical CPU devices, for the tf.distribute tests.

Set before TensorFlow initializes its devices (nothing has run yet when
pytest loads this file); every other test is placed on the first one.
"""

import os

if os.environ.get("SNAPSTORE_TEST_ENGINE") == "eager":
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  _cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * 2
  )
