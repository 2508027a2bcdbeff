"""Q1: Keras 3 mixed precision: compile() wraps the optimizer in a
LossScaleOptimizer; what are its variables, and where is the inner state?"""
from common import *
assert K3
keras.mixed_precision.set_dtype_policy("mixed_float16")
m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1, dtype="float32")])
m.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
o = m.optimizer
print("optimizer:", type(o).__name__, "inner:", type(getattr(o, "inner_optimizer", None)).__name__)
o.build(m.trainable_variables)
print("optimizer.variables:", [(v.path, v.dtype) for v in o.variables])
print("weights dtype:", [(w.path, w.dtype) for w in m.weights])
print("iterations is inner's:", o.iterations is o.inner_optimizer.iterations)
