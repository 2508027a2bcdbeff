"""TensorFlow's start-up notices, left out of snapstore's own programs' output.

On a machine without a GPU, importing TensorFlow 2.x writes lines such as

    I0000 00:00:1796164485.486836   20890 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
    E0000 00:00:1796164507.755053   21323 cuda_platform.cc:52] failed call to cuInit: ... UNKNOWN ERROR (303)

which a newcomer running the demo reads as errors. With `SNAPSTORE_QUIET_TF=1`
in the environment when snapstore is imported, before TensorFlow is (the demo,
the examples and the Makefile's demo targets set it), `snapstore._tf` imports
TensorFlow with these notices dropped, TF_CPP_MIN_LOG_LEVEL defaulting to 2 (no
informational lines or warnings from C++), TensorFlow's Python logger at ERROR
and tf-keras's deprecation warning for `tf.compat.v1.layers` ignored. Errors and everything
else TensorFlow writes still show. TF_CPP_MIN_LOG_LEVEL alone cannot do this:
TensorFlow 2.16+ writes these notices while it loads, before its logging reads
that variable. Unset, importing snapstore leaves TensorFlow's output as it is.

    SNAPSTORE_QUIET_TF=1 python -m snapstore.demo

This module only reads and writes text and file descriptors; `_tf` imports
TensorFlow.
"""

import contextlib
import os
import re
import sys
import tempfile
import warnings

ENV = "SNAPSTORE_QUIET_TF"

# A C++ log line in absl's format (TF 2.16+) or TensorFlow's own (TF 2.15 and
# older), whose message is one of TensorFlow's start-up notices.
_NOTICE = re.compile(
  r"(?:[IWEF]\d{4} [\d:.]+ +\d+ |[\d-]+ [\d:.]+: [IWEF] )\S+:\d+\] "
  r"(?:oneDNN custom operations are on|Could not find cuda drivers"
  r"|failed call to cuInit|Unable to register cu\w+ factory"
  r"|This TensorFlow binary is optimized to use available CPU instructions"
  r"|TF-TRT Warning: Could not find TensorRT)"
)
_ABSL_BANNER = (
  "WARNING: All log messages before absl::InitializeLog() is called are "
  "written to STDERR"
)
# The second line of the CPU instructions notice.
_CPU_NOTICE_END = "To enable the following instructions:"


def asked():
  """True if the environment asks for TensorFlow's start-up to be quiet."""
  return os.environ.get(ENV) == "1"


def drop_notices(text):
  """`text`, written by TensorFlow to stderr, without its start-up notices."""
  kept = []
  in_cpu_notice = False
  for line in text.splitlines(True):
    if (
      line.rstrip("\n") == _ABSL_BANNER
      or _NOTICE.match(line)
      or (in_cpu_notice and line.startswith(_CPU_NOTICE_END))
    ):
      in_cpu_notice = "optimized to use available CPU" in line
      continue
    in_cpu_notice = False
    kept.append(line)
  return "".join(kept)


@contextlib.contextmanager
def stderr_through(keep):
  """Captures file descriptor 2 in the block, then writes `keep(text)` to it.

  C++ code writes to the descriptor, not to `sys.stderr`, so only capturing
  the descriptor catches it. Where there is no descriptor 2, nothing is
  captured.

  Args:
    keep: A function from the captured text to the text to write.
  """
  sys.stderr.flush()
  try:
    saved = os.dup(2)
  except OSError:
    yield
    return
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      text = keep(captured.read().decode("utf-8", "replace"))
      if text:
        sys.stderr.write(text)
        sys.stderr.flush()


def ignore_layers_deprecation():
  """Ignores tf-keras's warning at every call of a tf.compat.v1.layers function.

  TF1-style programs (the demo's and the examples') build with those functions
  on TensorFlow 2.16+, where tf-keras provides them.
  """
  warnings.filterwarnings(
    "ignore", r"`tf\.layers\.\w+` is deprecated", UserWarning
  )
