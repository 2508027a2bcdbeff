"""The snapstore version, read by setup.py and exported as snapstore.__version__."""

__version__ = "0.1.0"
