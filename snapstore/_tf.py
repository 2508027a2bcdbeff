"""The one module that imports TensorFlow: version gate, graph mode, private APIs.

snapstore runs, from one code base, on TensorFlow 1.15 (Python 3.7; the
reference stack) and on TensorFlow 2.15 and newer, through `tf.compat.v1` in
graph mode and eagerly (Python 3.9 and newer). The rest of the package imports
TensorFlow only from here:

    from snapstore._tf import tf      # tensorflow.compat.v1, on every version
    from snapstore._tf import ops     # a private module; see the list below

Public names stand in for private ones where they are the same class on every
version: `tf.Tensor` for `ops.Tensor` (gone in TF 2.x), `tf.Operation`, and
`tf.Variable` (VariableV1) as the constructor that takes `use_resource=` and
`variable_def=`; isinstance checks use the base class `tf_variables.Variable`,
because TF 2.x's ResourceVariable is not a VariableV1.

Private TensorFlow APIs are used only for what no public one does (building a
variable from ops made here, copying an op, unwrapping a MonitoredSession).
Each private module is imported below with a comment saying what it is for,
and each private member of a TF object the package uses (`op._id`,
`Session._make_callable_from_options`, ...) is wrapped in a function here.
Where versions differ, a shim gives the package one name and says which
version needs it; shims detect the feature (an attribute, a module), not the
version number. Nothing outside this module looks at TensorFlow's version.

Engines. Importing snapstore changes nothing in TensorFlow. A store is built
for the engine in effect where TensorFlow would create its state
(`builds_eagerly`): graph mode (TF 1.15's default; TF 2.x programs choose it
with `tf.compat.v1.disable_v2_behavior()`, or build inside
`tf.Graph().as_default()`) or eager execution (TF 2.x's default). The eager
engine needs TensorFlow 2.15 or newer.

Keras. Which Keras `tf.keras` is, and Keras's own private attributes, are
`_keras.py`'s: the one other module that reads private attributes.
"""

import contextlib
import inspect
import os
import re
import sys

from snapstore import _tf_startup

_MIN_TF2 = (2, 15)


def _install_fix():
  """How to install a TensorFlow snapstore supports on this Python."""
  if sys.version_info[:2] <= (3, 7):
    return (
      "Install TensorFlow 1.15 on Python 3.7: `pip install 'snapstore[cpu]'` "
      "(tensorflow==1.15.*) or `pip install 'snapstore[gpu]'` "
      "(tensorflow-gpu==1.15.*)."
    )
  return (
    "Install TensorFlow 2.15 or newer with tf-keras (Python 3.9 and "
    "newer): `pip install 'snapstore[cpu]'` or `pip install "
    "'snapstore[gpu]'`; or TensorFlow 1.15 on Python 3.7."
  )


def _import():
  """Imports TensorFlow (quietly: see _tf_startup); an ImportError naming the fix."""
  if not _tf_startup.asked():
    return _import_tensorflow()
  # Without TensorFlow's informational lines and warnings from C++ too.
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  with _tf_startup.stderr_through(_tf_startup.drop_notices):
    tensorflow, version = _import_tensorflow()
    # TF 2.x probes for CUDA (cuInit) when it first lists the devices.
    list_devices = getattr(tensorflow.config, "list_physical_devices", None)
    if list_devices is not None:
      list_devices()
  tensorflow.get_logger().setLevel("ERROR")
  _tf_startup.ignore_layers_deprecation()
  return tensorflow, version


def _import_tensorflow():
  """Imports TensorFlow; an ImportError naming the fix if it is not usable."""
  try:
    import tensorflow  # pylint: disable=g-import-not-at-top
  except TypeError as e:
    # protobuf >= 3.21 breaks the generated *_pb2 modules of TF 1.15 with
    # "Descriptors cannot not be created directly".
    if "Descriptors cannot" in str(e):
      raise ImportError(
        "TensorFlow 1.15 cannot import with this protobuf version (%s). "
        "Fix: pip install 'protobuf<3.21'" % e
      )
    raise
  except ImportError as e:
    raise ImportError(
      "snapstore could not import TensorFlow (%s). %s" % (e, _install_fix())
    )
  return tensorflow, check_version(tensorflow.__version__)


def check_version(text):
  """`(major, minor)` of TensorFlow version `text`, or an ImportError.

  Supported: 1.15, and 2.15 or newer.
  """
  match = re.match(r"(\d+)\.(\d+)", text)
  version = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
  if not (version == (1, 15) or version >= _MIN_TF2):
    raise ImportError(
      "snapstore needs TensorFlow 1.15, or 2.15 or newer (in compat.v1 graph "
      "mode); found TensorFlow %s. %s" % (text, _install_fix())
    )
  return version


_tensorflow, VERSION = _import()
tf = _tensorflow.compat.v1
# The TF 2.x API (tf.function, tf.Module, tf.TensorSpec), for the eager engine.
tf2 = _tensorflow

# pylint: disable=g-direct-tensorflow-import,g-import-not-at-top,wrong-import-position,unused-import
# Eager context state, to tell a program that already ran eager ops (same path
# on every version).
from tensorflow.python.eager import context as _context


def builds_eagerly():
  """True if state made now would be eager (the eager engine), else graph.

  Decided where TensorFlow would create a variable: under `init_scope`, which
  leaves a `tf.function` being traced for the eager context (or for the TF1
  graph it is traced in). `tf.inside_function()` alone would not tell: it stays
  True inside `init_scope`.

  Raises:
    RuntimeError: Eager execution on TensorFlow 1.15, which the eager engine
      does not support.
  """
  with ops.init_scope():
    eager = _context.executing_eagerly()
  if eager and VERSION[0] < 2:
    raise RuntimeError(
      "snapstore's eager engine needs TensorFlow 2.15 or newer; on "
      "TensorFlow 1.15 it works in graph mode. Fix: do not call "
      "tf.enable_eager_execution() (or set TF2_BEHAVIOR=1), or move to "
      "TensorFlow 2.15+."
    )
  return eager


def eager_context():
  """TensorFlow's eager context (its coordination service's key-value store)."""
  return _context.context()


def inside_function():
  """True while a `tf.function` (or other FuncGraph) is being traced."""
  return ops.get_default_graph().building_function


# -- private modules, at the same path on TF 1.15 and 2.x ---------------------
# Graph internals with no public v1 name: colocate_with (the public one is
# deprecated and warns), name_scope, name_from_scope_name, the gradient
# registry that a rewired op's gradient override looks up.
from tensorflow.python.framework import ops

# Switch, RefSwitch and Merge as Python wrappers (a shadow initialized once,
# snapshot_before's copy that runs only on a finite loss), and CondContext,
# which a copied tf.cond branch gets (as import_meta_graph rebuilds it).
from tensorflow.python.ops import control_flow_ops

# IsInWhileLoop: which ops a copy of a subgraph cannot take.
from tensorflow.python.ops import control_flow_util

# The raw ops a ResourceVariable is built from (shadows made from their parts).
from tensorflow.python.ops import resource_variable_ops

# variable_op_v2 (a ref variable's op) and the ref assigns with use_locking.
from tensorflow.python.ops import state_ops

# The Variable base class (isinstance of every variable kind), PartitionedVariable
# and SaveSliceInfo (parts of a partitioned variable).
from tensorflow.python.ops import variables as tf_variables

# silence(): TF's deprecation warnings about its own constructors' arguments.
from tensorflow.python.util import deprecation

# _MonitoredSession and _WrappedSession, unwrapped to the raw tf.Session.
from tensorflow.python.training import monitored_session

# BaseSession: tf.Session and tf.InteractiveSession, told from wrappers.
from tensorflow.python.client import session as tf_session

# DistributedValues: the base class of a tf.distribute variable (a
# MirroredVariable, a SyncOnReadVariable), which TF 1.15 does not export.
from tensorflow.python.distribute import values as distribute_values

# ParameterServerStrategyExtended: the `extended` of
# tf.compat.v1.distribute.experimental.ParameterServerStrategy (and of
# CentralStorageStrategy, on one machine), which neither stack exports.
from tensorflow.python.distribute import parameter_server_strategy

# VariableDef, which shadows are made from (as import_meta_graph makes them).
from tensorflow.core.framework import variable_pb2

# CallableOptions, for Session._make_callable_from_options; ConfigProto, for
# the options of eager function calls (unoptimized_function_calls).
from tensorflow.core.protobuf import config_pb2

# FunctionDef: a function body (of a tf.function, a v2 tf.cond...) as the
# graph's library holds it, for what snapshot_before's check reads in it.
from tensorflow.core.framework import function_pb2

# AttrValue: the attribute that keeps a v2 tf.cond a function call.
from tensorflow.core.framework import attr_value_pb2
# pylint: enable=g-direct-tensorflow-import,g-import-not-at-top,wrong-import-position,unused-import

# -- graph attributes ---------------------------------------------------------


def keep_cond_as_call(cond_output):
  """Marks the v2 `tf.cond` that made `cond_output` to stay a function call.

  In a traced function TensorFlow lowers a `tf.cond` to switch and merge
  nodes, so that every node of the branch not taken still passes through the
  executor, as a dead one, at each call. An `If` op kept as a call runs only
  the branch taken (`cond_v2` sets the same attribute for XLA; `tf.cond` has
  no argument for it). For a rarely taken branch of many nodes.
  """
  op = cond_output.op
  while op.type not in ("If", "StatelessIf"):  # the cond's output identities
    op = op.inputs[0].op
  op._set_attr(  # pylint: disable=protected-access
    "_lower_using_switch_merge", attr_value_pb2.AttrValue(b=False)
  )


# -- shims: one name for what differs between versions ------------------------


def new_operation(node_def, graph, inputs, control_inputs, op_def):
  """An op built from `node_def` in `graph`, as import_graph_def builds one.

  TF 2.x builds it with `Operation.from_node_def` (its constructor takes a C op
  and aborts the interpreter when given a NodeDef); TF 1.15 with the constructor.
  """
  make = getattr(ops.Operation, "from_node_def", ops.Operation)
  return make(
    node_def, graph, inputs=inputs, control_inputs=control_inputs, op_def=op_def
  )


def graph_element(variable):
  """The read a variable was built with (its `_graph_element`), or None.

  A ResourceVariable reads itself once when it is made (the constructor's
  `Read/ReadVariableOp`, or the `snapshot_name` of its `VariableDef`) and
  returns that tensor when fetched; `value()` builds a new read each call.
  Same private member on 1.15 and 2.x.
  """
  element = getattr(variable, "_graph_element", None)
  return element if isinstance(element, tf.Tensor) else None


# The VarHandleOp of a ResourceVariable, with its handle data: renamed with a
# leading underscore in TF 2.x.
variable_handle_from_shape_and_dtype = getattr(
  resource_variable_ops, "variable_handle_from_shape_and_dtype", None
) or getattr(resource_variable_ops, "_variable_handle_from_shape_and_dtype")


def _object_graph_key():
  # The checkpoint entry that holds the object graph of a TF2-style (object
  # based) checkpoint, not a variable: in training.tracking on TF 1.15, in
  # trackable from TF 2.11 on.
  try:
    from tensorflow.python.trackable import base  # pylint: disable=g-direct-tensorflow-import,g-import-not-at-top
  except ImportError:
    from tensorflow.python.training.tracking import base  # pylint: disable=g-direct-tensorflow-import,g-import-not-at-top
  return base.OBJECT_GRAPH_PROTO_KEY


OBJECT_GRAPH_PROTO_KEY = _object_graph_key()

# Reading a truncated or corrupt checkpoint raises these: DataLossError and
# friends on every version, and IndexError from TF 2.x's reader for some
# truncations.
CHECKPOINT_READ_ERRORS = (tf.errors.OpError, IndexError)

# -- private members of TF objects, the same on TF 1.15 and 2.x --------------
# pylint: disable=protected-access


def creation_order(op):
  """`op`'s creation index in its graph (`Operation._id`): a deterministic order."""
  return op._id


def control_flow_context(op):
  """The v1 control-flow context `op` was built in (a CondContext...), or None."""
  return op._get_control_flow_context()


def reapply_device_functions(graph, op):
  """Places `op` by the device scopes in effect, as import_graph_def does for
  each op it imports (clears the op's device, then applies the scopes)."""
  op._set_device("")
  graph._apply_device_functions(op)


def set_save_slice_info(variable, info):
  """Marks `variable` as the part `info` of a partitioned variable."""
  variable._set_save_slice_info(info)


def registered_gradient(op_type):
  """The gradient function registered for `op_type`, under any override."""
  return ops._gradient_registry.lookup(op_type)


def is_ref_dtype(dtype):
  """True for a ref variable's reference dtype (float32_ref...)."""
  return dtype._is_ref_dtype


def callable_with_exact_feeds(session, feeds, target):
  """A callable running op `target` with tensors `feeds` fed, made by
  `Session._make_callable_from_options`: it takes each feed with its exact
  dtype and shape, unlike `make_callable`. None for sessions without it."""
  make = getattr(session, "_make_callable_from_options", None)
  if make is None:
    return None
  return make(
    config_pb2.CallableOptions(
      feed=[t.name for t in feeds], target=[target.name]
    )
  )


def raw_session(session):
  """The tf.Session under MonitoredSession and its wrappers (hooks, recovery);
  None if a MonitoredSession is closed. Other objects are returned as given."""
  if isinstance(session, monitored_session._MonitoredSession):
    session = session._tf_sess()
    if session is None:
      return None
  while isinstance(session, monitored_session._WrappedSession):
    session = session._sess
  return session


def session_under(session):
  """The tf.Session under wrappers that keep the session they wrap in `_sess`
  (MonitoredSession's, tfdbg's, and most hand-written ones); `session` itself
  when there is none. Only for telling sessions apart, never to run in: the
  wrapper's `run` may do more (count, trace)."""
  seen = 0
  while not isinstance(session, tf_session.BaseSession) and seen < 16:
    inner = getattr(session, "_sess", None)
    if inner is None:
      break
    session, seen = inner, seen + 1
  return session


def session_closed(session):
  """Whether tf.Session `session` was closed (`BaseSession._closed`; TF has no
  public flag). False for objects that are not sessions."""
  return isinstance(session, tf_session.BaseSession) and bool(
    getattr(session, "_closed", False)
  )


def not_converted(method):
  """Leaves `method` as it is when AutoGraph converts a `tf.function` that
  calls it: snapstore's calls have no Python control flow on tensors to
  convert, and converting them would read snapstore's source at every
  trace (and warn where it cannot)."""
  return tf2.autograph.experimental.do_not_convert(method)


def not_converted_methods(cls):
  """`cls` with each public method wrapped by `not_converted`."""
  for name, value in list(vars(cls).items()):
    public = not name.startswith("_") or name in ("__len__", "__contains__")
    if public and inspect.isfunction(value):
      setattr(cls, name, not_converted(value))
  return cls


# -- private attributes of tf.distribute, optimizers and Keras ------------------
# Read here only; each with what it is for and the versions it holds on.


def distribute_strategy_of(variable):
  """The strategy a distributed variable was made under, or None
  (`_distribute_strategy`: every variable kind, TF 1.15 and 2.x; the public
  `distribute_strategy` exists only on distributed ones)."""
  return getattr(variable, "_distribute_strategy", None)


def strategy_task(extended):
  """(ClusterSpec, task type, task id) a multi-worker strategy's `extended`
  records of its cluster (TF 1.15's has no `cluster_resolver`)."""
  return (extended._cluster_spec,) + strategy_task_id(extended)  # pylint: disable=protected-access


def strategy_task_id(extended):
  """(task type, task id) of this task, as a cluster strategy's `extended`
  records it (multi-worker, parameter-server v1)."""
  return extended._task_type, extended._task_id  # pylint: disable=protected-access


def strategy_workers(extended):
  """How many workers a strategy's `extended` runs on (`_num_workers`, 1
  where it does not say)."""
  return getattr(extended, "_num_workers", 1) or 1


def communication_timeout(strategy):
  """The collectives' timeout a strategy was given
  (`CommunicationOptions(timeout_seconds=)`), or None."""
  options = getattr(strategy.extended, "_communication_options", None)
  return getattr(options, "timeout_seconds", None)


def local_component(variable):
  """In replica context, the component of a distributed variable the
  replica owns: what `variable.value()` reads there
  (`_get_on_device_or_primary`)."""
  return variable._get_on_device_or_primary()  # pylint: disable=protected-access


def cluster_coordinator(strategy):
  """The `ClusterCoordinator` made for a parameter-server strategy (v2), or
  None (`_cluster_coordinator`)."""
  return getattr(strategy, "_cluster_coordinator", None)


def save_slice_info(variable):
  """The part of its partitioned variable `variable` is, or None
  (`_save_slice_info`)."""
  return getattr(variable, "_save_slice_info", None)


def optimizer_name(opt):
  """A tf.train optimizer's name (`_name`), or its class's."""
  return getattr(opt, "_name", type(opt).__name__)


def makes_no_state(opt):
  """A `tf.train.Optimizer` whose class makes no slots or non-slot variables
  (GradientDescent, ProximalGradientDescent): it never has any."""
  create = getattr(type(opt), "_create_slots", None)
  return isinstance(opt, tf.train.Optimizer) and (
    create is tf.train.Optimizer._create_slots  # pylint: disable=protected-access
  )


def wrapped_optimizer(opt):
  """The optimizer a TF 1.15 wrapper keeps (`_optimizer` or `_opt`), or None."""
  return getattr(opt, "_optimizer", None) or getattr(opt, "_opt", None)


def wrapper_state(opt):
  """(loss scale weights {(name, graph key): variable} or None, the loss
  scale manager or None, the EMA or None) a TF 1.15 optimizer wrapper
  keeps: `MixedPrecisionLossScaleOptimizer` and Keras's
  `LossScaleOptimizer` (`_loss_scale._weights`), contrib's
  `LossScaleOptimizer` (`_loss_scale_manager`), `MovingAverageOptimizer`
  (`_ema`)."""
  weights = getattr(getattr(opt, "_loss_scale", None), "_weights", None)
  return (
    weights,
    getattr(opt, "_loss_scale_manager", None),
    getattr(opt, "_ema", None),
  )


def call_with_captures(concrete, captures):
  """Calls `concrete` (a `ConcreteFunction` of no arguments) with `captures`
  in place of its `captured_inputs`, position by position.

  What a function reads through a captured variable handle it then reads
  through the handle given in its place (`ConcreteFunction._call_flat`, the
  call every `ConcreteFunction.__call__` makes, at the same place on TF 2.15
  and 2.21). Returns the function's structured outputs.
  """
  return concrete._call_flat([], list(captures))  # pylint: disable=protected-access


def function_captures(concrete):
  """[(external, internal)] of a `ConcreteFunction`'s graph captures: the
  tensor each capture takes from outside, and the placeholder that stands
  for it inside (`FuncGraph.captures`), in `captured_inputs` order."""
  graph = concrete.graph
  return list(zip(graph.external_captures, graph.internal_captures))


def replace_captures(graph, replacements):
  """Makes the function being traced in `graph` take, for each capture whose
  external tensor is a key of `replacements` (by `id`), the tensor given
  there instead, at the same place among its inputs.

  Called before the trace ends (inside the traced Python function), so
  that the `ConcreteFunction` made from `graph` has them as its captured
  inputs: the function reads, through each capture's placeholder, what its
  replacement holds (`FunctionCaptures.reset_captures`, TF 2.15 and 2.21).
  The variables it tells a `GradientTape` it read are replaced by
  `replace_graph_variables`.

  Args:
    graph: The `FuncGraph` being traced.
    replacements: `{id(external tensor): tensor}`.

  Returns:
    [(placeholder, external tensor replaced)] of each capture replaced.
  """
  captures = graph.function_captures
  externals = list(captures.by_val_external.values())
  internals = list(captures.by_val_internal.values())
  hits = [
    (inner, outer)
    for outer, inner in zip(externals, internals)
    if id(outer) in replacements
  ]
  if hits:
    captures.reset_captures(
      [replacements.get(id(t), t) for t in externals], internals
    )
  return hits


def replace_graph_variables(graph, replacements):
  """Replaces variables a `FuncGraph` being traced has seen read: what each
  call of its function tells the `GradientTape`s recording it that it read
  (`FuncGraph._watched_variables`, which becomes `graph.variables` when the
  trace ends; TF 2.15 and 2.21). `replacements` maps `id(variable)` to the
  variable reported instead."""
  watched = graph._watched_variables  # pylint: disable=protected-access
  for v in list(watched):
    if id(v) in replacements:
      watched.discard(v)
      watched.add(replacements[id(v)])


@contextlib.contextmanager
def unoptimized_function_calls():
  """Functions called eagerly in this block, on this thread, run their graph
  as traced: without Grappler's rewrites (fusing a MatMul, its BiasAdd and
  activation into one kernel), so that they compute what the same ops
  executed eagerly, one by one, compute (`context.function_call_options`,
  thread-local; the config is what a `tf.function` call op takes)."""
  ctx = _context.context()
  before = ctx.function_call_options
  config = config_pb2.ConfigProto()
  config.ParseFromString(before.config_proto_serialized)
  config.graph_options.rewrite_options.disable_meta_optimizer = True
  ctx.function_call_options = _context.FunctionCallOptions(
    executor_type=before.executor_type, config_proto=config
  )
  try:
    yield
  finally:
    ctx.function_call_options = before


def auto_trackable():
  """A new empty trackable object whose attributes a checkpoint saves
  (`AutoTrackable`, public as `tf.__internal__.tracking.AutoTrackable`)."""
  return tf2.__internal__.tracking.AutoTrackable()


def in_xla_context():
  """True while a function compiled by XLA (`jit_compile=True`) is traced."""
  return control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph())


def function_def(graph, name):
  """The FunctionDef of function `name` in `graph`'s library, or None.

  `Graph._get_function` returns the object TF keeps for each function added
  to the graph (a `_DefinedFunction`, or `_EagerDefinedFunction` on 1.15 and
  `AtomicFunction` on 2.x for tf.function and v2 control flow); each has the
  FunctionDef as `definition`. The public way, `graph.as_graph_def().library`,
  serializes the whole graph.
  """
  found = graph._get_function(name)
  definition = getattr(found, "definition", None) if found is not None else None
  return (
    definition if isinstance(definition, function_pb2.FunctionDef) else None
  )


def create_slots(optimizer, variables):
  """Makes a tf.train.Optimizer's slots for `variables` now (`_create_slots`,
  which apply_gradients calls)."""
  optimizer._create_slots(variables)


def in_graph_mode(variable):
  """True for a variable of a TF1 graph, False for an eager one
  (`_in_graph_mode`; eager variables have no `graph`)."""
  return bool(getattr(variable, "_in_graph_mode", False))


def module_variable_paths(module):
  """[(attribute path, variable)] of a `tf.Module`, each variable once.

  `tf.Module._flatten(with_path=True)` gives every path `Module.variables`
  walks (`layers/0/w`). A variable reachable by several paths is keyed by the
  shortest (then the first in sorted order), as a TF2 checkpoint names it.
  """
  best = {}
  found = module._flatten(
    predicate=lambda v: isinstance(v, tf_variables.Variable), with_path=True
  )
  for path, variable in found:
    key = "/".join(str(p) for p in path)
    rank = (len(path), key)
    if id(variable) not in best or rank < best[id(variable)][0]:
      best[id(variable)] = (rank, key, variable)
  return [
    (key, var) for _, key, var in sorted(best.values(), key=lambda b: b[0])
  ]


def parse_object_graph(serialized):
  """The `TrackableObjectGraph` proto a TF2 checkpoint keeps (its object graph
  entry, `OBJECT_GRAPH_PROTO_KEY`)."""
  from tensorflow.core.protobuf import trackable_object_graph_pb2  # pylint: disable=g-direct-tensorflow-import,g-import-not-at-top

  graph = trackable_object_graph_pb2.TrackableObjectGraph()
  graph.ParseFromString(serialized)
  return graph


def trackable_children(obj):
  """`{local name: child}` of a trackable object, as a checkpoint names them
  (`tf.train.TrackableView.children`, public from TF 2.x)."""
  return _tensorflow.train.TrackableView.children(obj)


# pylint: enable=protected-access


def is_sharded_variable(obj):
  """A `ShardedVariable`: a variable partitioned across parameter servers
  (`ParameterServerStrategy` with a `variable_partitioner`). TF 2.x only."""
  internal = getattr(getattr(tf2, "__internal__", None), "distribute", None)
  cls = getattr(internal, "ShardedVariable", None)
  return cls is not None and isinstance(obj, cls)


def _mode_now():
  """How the process runs now: eagerly, or in (compat.v1) graph mode."""
  if builds_eagerly():
    return "eager"
  return "compat.v1 graph mode" if VERSION[0] >= 2 else "graph mode"


def stack():
  """The stack this process runs on, for benchmarks and bootstrap output."""
  import numpy  # pylint: disable=g-import-not-at-top
  import h5py  # pylint: disable=g-import-not-at-top

  return "TensorFlow %s (%s), Python %s, numpy %s, h5py %s" % (
    _tensorflow.__version__,
    _mode_now(),
    ".".join(str(v) for v in sys.version_info[:3]),
    numpy.__version__,
    h5py.__version__,
  )


# -- optimizers and Keras models: Lookahead's private reads --------------------
# pylint: disable=protected-access


def distributed_apply(optimizer, strategy, grads_and_vars, global_step):
  """A `tf.train.Optimizer`'s update in the `merge_call` of a strategy's
  replicas: what its own `apply_gradients` merges into
  (`Optimizer._distributed_apply`, TF 1.15 and 2.x). Graph-mode Lookahead
  builds its step around it, once for every replica."""
  return optimizer._distributed_apply(
    strategy, grads_and_vars, global_step=global_step
  )


# pylint: enable=protected-access
