"""What Python 3.5, which TensorFlow 1.15 still supports, lacks."""


def fspath(path):
  """`os.fspath` (new in Python 3.6): a path-like object's path; anything else as is."""
  return path.__fspath__() if hasattr(path, "__fspath__") else path
