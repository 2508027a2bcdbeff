"""Q4: exact swap for evaluate_with (scratch shadows), bit-exact incl. NaN
payloads, -0.0, inf, denormals; and Keras 3 SwapEMAWeights is not exact."""
from common import *

special = np.array([0x7fc00001, 0xffc12345, 0x7f800001,   # quiet NaNs w/ payload, signalling NaN
                    0x80000000, 0x00000001, 0x7f800000,   # -0.0, smallest denormal, +inf
                    0xff800000, 0x3f800000], np.uint32)  # -inf, 1.0
cur_bits = special
slot_bits = special[::-1].copy()
var = tf.Variable(cur_bits.view(np.float32))
slot = tf.Variable(slot_bits.view(np.float32), trainable=False)
scratch = tf.Variable(tf.zeros_like(var), trainable=False)

@tf.function(autograph=False)
def swap_in():           # current -> scratch, slot -> variable
  scratch.assign(var.read_value(), read_value=False)
  var.assign(slot.read_value(), read_value=False)
@tf.function(autograph=False)
def swap_out():          # scratch -> variable
  var.assign(scratch.read_value(), read_value=False)

seen = {}
def evaluate_with(fn):
  swap_in()
  try:
    return fn()
  finally:
    swap_out()
def fn():
  seen["bits"] = var.numpy().view(np.uint32).copy()
  raise RuntimeError("user fn fails")
try:
  evaluate_with(fn)
except RuntimeError:
  pass
print("inside fn, variable bits == slot bits:", np.array_equal(seen["bits"], slot_bits))
print("after (fn raised), variable bits == original:", np.array_equal(var.numpy().view(np.uint32), cur_bits))
print("slot untouched:", np.array_equal(slot.numpy().view(np.uint32), slot_bits))
print("traces:", swap_in.experimental_get_tracing_count(), swap_out.experimental_get_tracing_count())

# The arithmetic swap Keras 3 SwapEMAWeights uses on the TF backend:
#   a.assign_add(b); b.assign(a - b); a.assign(a - b)
def arith_swap(a, b):
  a.assign_add(b); b.assign(a - b); a.assign(a - b)
a = tf.Variable(np.array([1e8, 0.1, -0.0, 3.0, np.nan, 1.0], np.float32))
b = tf.Variable(np.array([1.0, 1e-9, 0.0, np.inf, 1.0, np.float32(0x7fc00001).view(np.float32) if False else 2.0], np.float32))
a0, b0 = a.numpy().copy(), b.numpy().copy()
arith_swap(a, b); arith_swap(a, b)   # swap in, swap out
print("\narith swap twice: a bits restored per element:", (a.numpy().view(np.uint32) == a0.view(np.uint32)).tolist())
print("  a before", a0.tolist(), "\n  a after ", a.numpy().tolist())
print("  b before", b0.tolist(), "\n  b after ", b.numpy().tolist())

if K3:
  # Through the real callback: fit with use_ema, then evaluate() swaps in and out.
  keras.utils.set_random_seed(1)
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(256), keras.layers.Dense(1)])
  model.compile(optimizer=keras.optimizers.SGD(0.05, use_ema=True, ema_momentum=0.9), loss="mse")
  x = np.random.RandomState(0).randn(64, 4).astype("f4"); y = x.sum(1, keepdims=True)
  model.fit(x, y, epochs=3, batch_size=16, verbose=0)
  print("\nafter fit, weights == EMA bitwise (fit ends with finalize_variable_values):",
        all(same_bits(w.numpy(), v.numpy()) for w, v in zip(model.trainable_weights, model.optimizer._model_variables_moving_average)))
  for _ in range(3): model.train_on_batch(x[:16], y[:16])   # weights and EMA now differ
  w0 = [w.numpy().copy() for w in model.trainable_weights]
  ema0 = [v.numpy().copy() for v in model.optimizer._model_variables_moving_average]
  cb = keras.callbacks.SwapEMAWeights(swap_on_epoch=False)
  inside = {}
  class Probe(keras.callbacks.Callback):
    def on_test_batch_begin(self, batch, logs=None):
      inside["w"] = [w.numpy().copy() for w in self.model.trainable_weights]
  model.evaluate(x, y, verbose=0, callbacks=[cb, Probe()])  # on_test_begin/end swap twice
  print("\nduring evaluate the weights are the EMA (bitwise):",
        all(same_bits(a, b) for a, b in zip(inside["w"], ema0)))
  diff = [int((w.numpy().view(np.uint32) != a.view(np.uint32)).sum()) for w, a in zip(model.trainable_weights, w0)]
  diffe = [int((v.numpy().view(np.uint32) != a.view(np.uint32)).sum()) for v, a in zip(model.optimizer._model_variables_moving_average, ema0)]
  print("\nKeras 3 SwapEMAWeights around evaluate(): weights elements changed per variable:", diff,
        "of", [w.size for w in w0], "; EMA elements changed:", diffe)
  print("  max abs change in weights:", max(float(np.abs(model.trainable_weights[i].numpy() - w0[i]).max()) for i in range(len(w0))))
