"""What snapstore's optimizer wrappers share: delegation and per-graph state.

`Lookahead` and `RollbackOptimizer` subclass `tf.train.Optimizer`, delegate
gradients and slots to an inner optimizer, and order their own in-graph work
around the inner step with control dependencies, as contrib's
`MovingAverageOptimizer` does. Each builds one train op per graph and keeps the
state of that graph (its device store and variables) on the graph itself, so
that a graph the optimizer was used in can be freed while the optimizer lives
on (an Estimator builds a new graph for each `train()` call). For the same
reason the wrappers make their own variables rather than TF's non-slot
variables, which `tf.train.Optimizer` keys by graph.
"""

import weakref

from snapstore._tf import create_slots
from snapstore._tf import ops
from snapstore._tf import tf
from snapstore.engines.graph import attached
from snapstore.engines.graph import copies
from snapstore.engines.graph import in_step


class WrapperOptimizer(tf.train.Optimizer):
  """A `tf.train.Optimizer` around an inner one, with state per graph.

  Args:
    optimizer: The inner `tf.train.Optimizer`.
    use_locking: Passed to `tf.train.Optimizer`.
    name: The optimizer's name.

  Raises:
    TypeError: `optimizer` is not a `tf.train.Optimizer`.
  """

  # What a refusal of a Keras optimizer offers instead (a subclass's own).
  _keras_way = "Keras optimizers are not supported."

  def __init__(self, optimizer, use_locking, name):
    if not isinstance(optimizer, tf.train.Optimizer):
      raise TypeError(
        "%s wraps a tf.train.Optimizer (e.g. tf.train.AdamOptimizer(...)), got "
        "%r. %s" % (type(self).__name__, optimizer, self._keras_way)
      )
    super(WrapperOptimizer, self).__init__(use_locking, name)
    self._optimizer = optimizer
    self._states = attached.PerObject("optimizer_state")  # on each graph
    # Graphs in which the train op is built (a state may come first, from
    # `create_optimizer_slots`).
    self._built = attached.PerObject("optimizer_built")
    self._graphs = weakref.WeakSet()  # the graphs with a state

  @property
  def optimizer(self):
    """The inner optimizer."""
    return self._optimizer

  def compute_gradients(self, *args, **kwargs):  # pylint: disable=arguments-differ
    """Computes gradients with the inner optimizer (see `tf.train.Optimizer`)."""
    return self._optimizer.compute_gradients(*args, **kwargs)

  def get_slot(self, var, name):
    return self._optimizer.get_slot(var, name)

  def get_slot_names(self):
    return self._optimizer.get_slot_names()

  def variables(self):
    """The inner optimizer's variables, then the wrapper's own, for the default graph."""
    state = self._states.get(tf.get_default_graph())
    own = self._own_variables(state) if state is not None else []
    return self._optimizer.variables() + sorted(own, key=lambda v: v.name)

  def _own_variables(self, state):
    """The wrapper's variables in `state` (a graph's state)."""
    raise NotImplementedError

  def _own_variable(self, initial_value, name, colocate_with):
    """A non-trainable global variable of the wrapper, placed with `colocate_with`.

    Made as `tf.train.Optimizer` makes its non-slot variables (same name,
    kind and placement, so checkpoints keep their names), but kept in the
    graph's state instead of a dict keyed by the graph.
    """
    with ops.init_scope(), ops.colocate_with(colocate_with):
      return tf.Variable(
        initial_value,
        name=name,
        trainable=False,
        use_resource=copies.is_resource(colocate_with),
      )

  def _trained_variables(self, grads_and_vars):
    """The variables with a gradient, checked to be of a graph without a train op."""
    variables = [v for g, v in grads_and_vars if g is not None]
    if not variables:
      raise ValueError(
        "No gradients provided for any variable: %s."
        % ([v.name for _, v in grads_and_vars],)
      )
    if self._built.get(variables[0].graph):
      raise ValueError(
        "%s %r already has a train op in this graph; create one %s per train "
        "op." % (type(self).__name__, self.get_name(), type(self).__name__)
      )
    return variables

  def _create_slots(self, var_list):
    """What `snapstore.create_optimizer_slots(wrapper, var_list)` calls: the
    inner optimizer's slots, then the wrapper's own state (`_prepare`)."""
    create_slots(self._optimizer, var_list)
    self._prepare(var_list)

  def _prepare(self, var_list):
    """Makes the wrapper's own variables for `var_list` before its train op,
    where it can (Lookahead); by default nothing."""
    del var_list

  def _mark_built(self, graph):
    """Records that `graph` has the wrapper's train op (one per graph)."""
    self._built.set(graph, True)

  def _replaces(self, inner_op, train_op):
    """Lists `train_op` in the graph's TRAIN_OP collection instead of `inner_op`.

    `tf.train.Optimizer.apply_gradients` lists its op there; the inner
    optimizer's op alone is not a complete step of the wrapper.
    """
    in_step.replace_train_op([inner_op], train_op, always=True)
    return train_op

  def _state(self, graph):
    """The state of `graph`; by default of the only graph with a train op, or
    of the default graph."""
    graphs = list(self._graphs)
    if graph is None and len(graphs) == 1:
      graph = graphs[0]
    graph = graph or tf.get_default_graph()
    state = self._states.get(graph)
    if state is None:
      raise ValueError(
        "%s %r has no train op in this graph yet; call minimize() or "
        "apply_gradients() first." % (type(self).__name__, self.get_name())
      )
    return state

  def _set_state(self, graph, state):
    self._states.set(graph, state)
    self._graphs.add(graph)

  def _state_of_session(self, session):
    sess = session or tf.get_default_session()
    return self._state(sess.graph if sess is not None else None)
