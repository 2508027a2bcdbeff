"""Installs snapstore.

Two stacks, told apart by the Python version, since TensorFlow 1.15 runs only on
Python 3.5-3.7 and TensorFlow 2.15+ only on 3.9 and newer:

- Python 3.7: TensorFlow 1.15 (the reference stack), numpy < 1.19, h5py 2, and
  protobuf < 3.21, without which TF 1.15 fails to import.
- Python 3.9 and newer: TensorFlow 2.15 or newer, in compat.v1 graph mode or
  eagerly, numpy 1.26 or 2, h5py 3; protobuf is left to TensorFlow. (TensorFlow
  2.15 has wheels for Python 3.9-3.11, 2.21 for 3.10-3.13.)

TensorFlow is not a hard requirement, because its CPU and GPU builds are
different distributions (`tensorflow` and `tensorflow-gpu` for 1.15; the
`and-cuda` extra of `tensorflow` for 2.x) and pip cannot express "either". Pick
one with an extra:

    pip install snapstore[cpu]   # tensorflow 1.15, or tensorflow 2.x + tf-keras
    pip install snapstore[gpu]   # tensorflow-gpu 1.15, or tensorflow[and-cuda] 2.x + tf-keras

or install TensorFlow yourself first. Importing snapstore without a usable
TensorFlow raises an ImportError that says which of these to run.
"""

import os
import re

from setuptools import find_packages
from setuptools import setup

_HERE = os.path.dirname(os.path.abspath(__file__))


def _tf1(requirement):
  """`requirement` on the TensorFlow 1.15 stack (Python 3.7) only."""
  return requirement + "; python_version < '3.8'"


def _tf2(requirement):
  """`requirement` on the TensorFlow 2.x stack (Python 3.9 and newer) only."""
  return requirement + "; python_version >= '3.9'"


def _version():
  with open(os.path.join(_HERE, "snapstore", "_version.py")) as f:
    return re.search(r'__version__ = "([^"]+)"', f.read()).group(1)


def _long_description():
  with open(os.path.join(_HERE, "README.md")) as f:
    return f.read()


setup(
  name="snapstore",
  version=_version(),
  description=(
    "In-memory snapshots of TensorFlow variables, in graph mode (TF 1.15, "
    "or TF 2.x through tf.compat.v1) and eagerly (TF 2.x, Keras 3 or "
    "tf-keras): snapshot, roll back and evaluate past parameters next to "
    "current ones."
  ),
  long_description=_long_description(),
  long_description_content_type="text/markdown",
  packages=find_packages(include=["snapstore", "snapstore.*"]),
  # 3.7 for TensorFlow 1.15; 3.9 and newer for TensorFlow 2.x: every Python
  # the supported TensorFlow releases run on (2.15: 3.9-3.11; 2.21:
  # 3.10-3.13), tested at both ends (2.15 on 3.9, 2.21 on 3.13). No
  # TensorFlow this supports runs on 3.8.
  python_requires=">=3.7, !=3.8.*",
  install_requires=[
    # What TensorFlow 1.15.5 itself pins.
    _tf1("numpy>=1.16,<1.19"),
    _tf1("h5py>=2.9,<3"),
    # TensorFlow 1.15 fails to import with protobuf 3.21 and newer.
    _tf1("protobuf>=3.6.1,<3.21"),
    _tf2("numpy>=1.26"),
    _tf2("h5py>=3.10"),
    "xxhash>=2.0",
  ],
  entry_points={"console_scripts": ["snapstore = snapstore.cli:main"]},
  extras_require={
    # tf-keras: TF 2.16+ has tf.compat.v1.layers and TF1-style Keras only
    # through it (with TF_USE_LEGACY_KERAS=1); Keras 3 has no graph mode.
    "cpu": [
      _tf1("tensorflow>=1.15,<1.16"),
      _tf2("tensorflow>=2.15"),
      _tf2("tf-keras>=2.15"),
    ],
    "gpu": [
      _tf1("tensorflow-gpu>=1.15,<1.16"),
      _tf2("tensorflow[and-cuda]>=2.15"),
      _tf2("tf-keras>=2.15"),
    ],
  },
  classifiers=[
    "Programming Language :: Python :: 3.7",
    "Programming Language :: Python :: 3.9",
    "Programming Language :: Python :: 3.10",
    "Programming Language :: Python :: 3.11",
    "Programming Language :: Python :: 3.12",
    "Programming Language :: Python :: 3.13",
    "Topic :: Scientific/Engineering :: Artificial Intelligence",
  ],
)
