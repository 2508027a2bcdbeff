"""pytest configuration: quiet TensorFlow logs before TF is imported."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
