"""`store.slots.past(fn, slot)` on the eager engine: `fn` reading a slot, no copy.

A target network, a Polyak average or a past-state loss needs a function of
the model computed with a slot's values next to the current ones, in the
same step. The swap (`evaluate_with`) copies three times per call; a second
model holds a second copy and must be kept in step by hand. `past` does
neither: it traces `fn` into a `tf.function` of its own and makes that
function read, through each variable of the store it captures, the slot's
shadow of that variable instead:

    store = snapstore.SnapshotStore(var_list=critic, mode="device")
    soft = snapstore.MovingAverage(store, tau=0.005, form="lerp", tag="target")
    target_q = store.slots.past(lambda s, a: critic([s, a]), soft.slot)

    @tf.function
    def train_step(s, a, r, s2, a2):
      y = r + gamma * target_q(s2, a2)     # the target network's output
      ...

When the trace of `fn` ends, still inside it, each capture whose tensor is a
covered variable's handle (each component's, for a distributed variable) is
given the handle of its shadow in the slot, at the same place among the
function's inputs (`_tf.replace_captures`). The function so made is an
ordinary `tf.function`: one trace per input signature, as any, and every
call reads what the slot holds when it runs (a `MovingAverage` update, a
`snapshot()` into the slot, a checkpoint restored into it). Nothing is
copied and nothing is put back.

What the values are: bit for bit those of `fn` on a separate model holding
the slot's values, called the same way. Inside the user's `tf.function` the
call is a function call that TensorFlow inlines into the step, so
Grappler's rewrites treat it as they treat the separate model's ops. Called
eagerly, the function runs without Grappler's rewrites
(`_tf.unoptimized_function_calls`): a fused MatMul-BiasAdd-ReLU kernel
rounds otherwise than the three ops a model executes eagerly, one by one.
A `fn` that is itself a `tf.function` runs optimized, as it runs when
called eagerly; a `tf.function` called inside a Python `fn` runs
unoptimized with the rest (call `past` inside your own `tf.function`, or
pass that `tf.function` itself, for its optimized bits).

Gradients: the current variables are not read, so none flows to them (a
`GradientTape` is told the shadows were read, and does not watch them: they
are not trainable). Gradients flow to the inputs, as through a separate
model; eagerly they are that model's bit for bit, except through a
recurrent layer, whose time loop Keras runs in Python eagerly and `past`
runs as the `tf.while_loop` of its trace (whose gradient sums in another
order).

Refused, when `fn` is traced (before anything runs): a `fn` that writes a
covered variable (batch norm's statistics with `training=True`, a Keras 3
dropout's seed state): the write would land in the slot. And a `fn` that
creates variables (an unbuilt model): build it first.
"""

from snapstore import _tf
from snapstore._tf import ops
from snapstore._tf import tf2
from snapstore.core import writers
from snapstore.core.distributed import components


class PastFunction(object):
  """`fn` computed from slot `slot`'s shadows (see module doc).

  Made by `store.slots.past(fn, slot)`; call it as `fn` is called.

  Args:
    fn: A Python callable (a lambda over a model, a `tf.function`).
    specs: The store's `VariableSpec`s.
    shadows: The slot's shadow of each, in the same order.
    store_name: The store's name, for messages.
    slot: The slot, for messages.
  """

  def __init__(self, fn, specs, shadows, store_name, slot):
    self._fn = fn
    self._store_name = store_name
    self._slot = slot
    # id(a covered component's handle) -> (key, the shadow component's)
    self._handles = {}
    # id(a covered component) -> its shadow component (for the tape)
    self._variables = {}
    for spec, shadow in zip(specs, shadows):
      for part, shadow_part in zip(
        components(spec.variable), components(shadow)
      ):
        self._handles[id(part.handle)] = (spec.key, shadow_part.handle)
        self._variables[id(part)] = shadow_part
    # AutoGraph converts `fn`, as a tf.function of it would, but not the
    # body around it: the errors the body raises reach the caller as raised.
    self._converted = tf2.__internal__.autograph.tf_convert(
      fn, tf2.__internal__.autograph.control_status_ctx()
    )
    self._function = tf2.function(self._traced, autograph=False)
    # A tf.function runs optimized when called eagerly; anything else as
    # its ops run eagerly (module doc).
    self._fn_is_function = hasattr(fn, "get_concrete_function")
    name = getattr(fn, "__name__", None) or type(fn).__name__
    self.__name__ = "past_%s" % name

  @property
  def function(self):
    """The `tf.function` reading the slot (for `experimental_get_tracing_count`,
    `get_concrete_function`)."""
    return self._function

  @property
  def slot(self):
    """The slot the function reads."""
    return self._slot

  def __call__(self, *args, **kwargs):
    if tf2.executing_eagerly() and not self._fn_is_function:
      with _tf.unoptimized_function_calls():
        return self._function(*args, **kwargs)
    return self._function(*args, **kwargs)

  def __repr__(self):
    return "<past of %r on slot %d of store %r>" % (
      self._fn,
      self._slot,
      self._store_name,
    )

  def _traced(self, *args, **kwargs):
    """The traced body: `fn`, then its covered captures replaced."""
    with tf2.variable_creator_scope(self._refuse_creation):
      out = self._converted(*args, **kwargs)
    graph = ops.get_default_graph()
    replaced = _tf.replace_captures(
      graph,
      dict((k, handle) for k, (_, handle) in self._handles.items()),
    )
    _tf.replace_graph_variables(graph, self._variables)
    written = writers.written_handles([inner for inner, _ in replaced])
    if written:
      keys = sorted(set(self._handles[id(replaced[k][1])][0] for k in written))
      raise ValueError(
        "store.slots.past(%s) on store %r: the function writes variables "
        "of the store (%s), which past() reads from slot %d instead, so the "
        "write would change the slot. Call the model so that it writes "
        "nothing (training=False: batch normalization updates its "
        "statistics, and Keras 3 dropout its seed state, in training "
        "mode), or leave that variable out of the store."
        % (self._fn_name(), self._store_name, ", ".join(keys), self._slot)
      )
    return out

  def _refuse_creation(self, next_creator, **kwargs):
    del next_creator
    raise ValueError(
      "store.slots.past(%s) on store %r: the function creates a variable "
      "(%s) when traced; past() computes it from the slot's values of the "
      "variables the store already covers. Build the model first (call it "
      "once on a batch, or model.build(input_shape)), then build the store "
      "over it." % (self._fn_name(), self._store_name, kwargs.get("name"))
    )

  def _fn_name(self):
    return getattr(self._fn, "__name__", None) or repr(self._fn)
