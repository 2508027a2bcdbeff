"""Q2: tf.function's frequent-retracing warning counts first traces of all
functions sharing one Python code object (a factory): 6 per-slot copy functions
trigger it. Tracing them at build time with get_concrete_function() does not."""
import logging, io
from common import *
buf = io.StringIO()
h = logging.StreamHandler(buf); tf.get_logger().addHandler(h)
V = [tf.Variable(tf.zeros([4])) for _ in range(3)]
def factory(shadows):
  @tf.function(autograph=False)
  def copy():
    for s, v in zip(shadows, V): s.assign(v)
  return copy
def shadows(): return [tf.Variable(tf.zeros([4]), trainable=False) for _ in V]
fns = [factory(shadows()) for _ in range(6)]
for f in fns: f()
print("first call of 6 factory-made functions -> warning logged:", "triggered tf.function retracing" in buf.getvalue())
buf.truncate(0); buf.seek(0)
fns = [factory(shadows()) for _ in range(6)]
for f in fns: f.get_concrete_function()    # trace at store build
for f in fns: f(); f()
print("traced at build with get_concrete_function(), then called -> warning:", "triggered tf.function retracing" in buf.getvalue(),
      "; tracing counts", [f.experimental_get_tracing_count() for f in fns])
