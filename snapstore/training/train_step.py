"""Replacing a Keras model's `train_step` for one `fit`, and putting it back.

`SnapshotCallback(in_step=True)` runs its work inside the compiled train
step: at `on_train_begin` it sets a wrapper as `model.train_step` on the
instance and makes Keras trace a new train function, and at `on_train_end`
(or before it raises) it puts the original back. Keras calls
`model.train_step` when it traces the train function, so the wrapper takes
effect in the function made here (`fit` made its own before
`on_train_begin`, and reads `model.train_function` at every batch).

    train_step.wrap(model, lambda step, data: guarded(step, data))
    ...
    train_step.unwrap(model)     # does nothing if `wrap` did not run
"""

import functools

from snapstore._keras import is_keras_3_object
from snapstore._tf import tf2


def wrap(model, guarded):
  """Replaces `model.train_step` on the instance; re-makes the train function.

  Args:
    model: The Keras model.
    guarded: A function `(step, data) -> logs`, called when Keras traces the
      train step, with the original step (converted by AutoGraph where Keras
      would have converted it) and the step's data. If it raises, the
      original step is put back before the error passes on.
  """
  unwrap(model, remake=False)  # one left by a fit that raised
  step = original = model.train_step
  if not is_keras_3_object(model):
    # tf-keras traces its train function with AutoGraph, which converts the
    # step; the wrapper itself is not converted (AutoGraph takes a function
    # set on the instance for a method, and calls it with the model as
    # `data`), so the step is converted here, as it would have been.
    method = getattr(step, "__func__", None)  # to_graph unbinds methods
    if method is not None:
      step = functools.partial(tf2.autograph.to_graph(method), step.__self__)
    else:
      step = tf2.autograph.to_graph(step)

  @tf2.autograph.experimental.do_not_convert
  def train_step(data):
    try:
      return guarded(step, data)
    except Exception:
      # The trace runs in fit's first batch: leave the model as it was
      # (eagerly: tf-keras reads a variable to make its train function).
      with tf2.init_scope():
        unwrap(model)
      raise

  train_step.snapstore_wrapped = (original, "train_step" in vars(model))
  model.train_step = train_step
  model.make_train_function(force=True)


def unwrap(model, remake=True):
  """Puts back the `train_step` `wrap` replaced, if it did.

  Args:
    model: The Keras model.
    remake: Whether to make Keras trace the train function again.
  """
  wrapped = getattr(vars(model).get("train_step"), "snapstore_wrapped", None)
  if wrapped is None:
    return
  step, own = wrapped
  if own:  # the user's function on the instance
    model.train_step = step
  else:
    del model.train_step
  if remake:
    model.make_train_function(force=True)


def is_keras_method(model, name):
  """Whether `model.<name>` is Keras's own: Keras 3, tf-keras or Keras 2's,
  not a subclass's, and not set on the instance (except by `wrap`)."""
  if name in vars(model):
    wrapped = getattr(vars(model)[name], "snapstore_wrapped", None)
    if wrapped is None or wrapped[1]:  # set by the user
      return False
  method = getattr(type(model), name, None)
  module = getattr(method, "__module__", None) or ""
  return module.split(".")[0] in ("keras", "tf_keras")
