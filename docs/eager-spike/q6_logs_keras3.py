"""Q6a (Keras 3 fit): what batch callbacks receive; logs are running means;
jit_compile="auto" on CPU; metric state; learning-rate assign from a callback."""
from common import *
assert K3
keras.utils.set_random_seed(0)
rng = np.random.RandomState(0)
X = rng.randn(64, 5).astype("f4"); Y = (X @ rng.randn(5, 1)).astype("f4")
model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", metrics=["mae"])
print("compile(jit_compile='auto') resolved to model.jit_compile =", model.jit_compile,
      "on", [d.device_type for d in tf.config.list_physical_devices()])

class Rec(keras.callbacks.Callback):
  def __init__(self): super().__init__(); self.rows = []
  def on_train_batch_begin(self, batch, logs=None):
    if batch == 0: print("on_train_batch_begin(0, logs=%r)" % (logs,))
    w = [v.numpy() for v in self.model.trainable_weights]
    xb, yb = X[batch * 16:(batch + 1) * 16], Y[batch * 16:(batch + 1) * 16]
    own = float(np.mean((xb @ w[0] + w[1] - yb) ** 2, dtype=np.float64))
    self.rows.append([batch, own])
  def on_train_batch_end(self, batch, logs=None):
    if batch == 0:
      print("on_train_batch_end(0, logs=%r) types %s" % (logs, {k: type(v).__name__ for k, v in logs.items()}))
    tot, cnt = [v.numpy() for v in self.model.metrics[0].variables]
    self.rows[-1] += [logs["loss"], float(tot), float(cnt)]
rec = Rec()
model.fit(X, Y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[rec])
print("batch  own loss (numpy)  logs['loss']   running mean of own   total/count")
owns = []
for b, own, lg, tot, cnt in rec.rows:
  owns.append(own)
  print("%5d %16.6f %13.6f %20.6f %13.6f" % (b, own, lg, np.mean(owns), tot / cnt))
print("loss tracker:", [(v.path, type(v).__name__) for v in model.metrics[0].variables],
      "; model.metrics:", [m.name for m in model.metrics])

# Learning-rate change from a callback: is it seen by the compiled step?
class Cut(keras.callbacks.Callback):
  def on_train_batch_begin(self, batch, logs=None):
    if batch == 2: self.model.optimizer.learning_rate.assign(0.0)
  def on_train_batch_end(self, batch, logs=None):
    self.w = getattr(self, "w", []) + [self.model.trainable_weights[0].numpy().copy()]
cut = Cut()
model.fit(X, Y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cut])
print("after learning_rate.assign(0.0) at batch 2: weights change per batch:",
      [bool(np.any(a != b)) for a, b in zip(cut.w, cut.w[1:])],
      "; lr now", float(model.optimizer.learning_rate.numpy()), type(model.optimizer.learning_rate).__name__)
model.optimizer.learning_rate = 0.005   # the setter assigns into the same variable
print("optimizer.learning_rate = 0.005 ->", float(model.optimizer.learning_rate.numpy()),
      "same variable object in optimizer.variables:", any(v is model.optimizer.learning_rate for v in model.optimizer.variables))
