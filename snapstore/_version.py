"""The snapstore version, read by setup.py and exported as snapstore.__version__."""

__version__ = "0.1.0"
"""The version of snapstore, as `pip` shows it.

Example:
  ```python
  print(snapstore.__version__)  # "0.1.0"
  ```
"""
