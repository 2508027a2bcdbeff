"""Q1 keys (Keras 3): are variable.path values unique? Where do they collide?"""
from common import *
assert K3
from keras import layers
from collections import Counter

class Two(layers.Layer):
  def build(self, s):
    self.a = self.add_weight(shape=(2,), name="w")
    self.b = self.add_weight(shape=(2,), name="w")   # same name twice
  def call(self, x): return x * self.a * self.b

m = keras.Sequential([keras.Input((2,)), Two(name="two")], name="m")
print("1) two add_weight(name='w'):", [v.path for v in m.weights])

# Optimizer slot names come from path.replace('/', '_'): 'x/y_z' vs 'x_y/z'.
i = keras.Input((2,))
a = keras.Sequential([layers.Dense(2, name="y_z")], name="x")
b = keras.Sequential([layers.Dense(2, name="z")], name="x_y")
m2 = keras.Model(i, b(a(i)))
opt = keras.optimizers.SGD(momentum=0.9); opt.build(m2.trainable_variables)
paths = [v.path for v in opt.variables]
print("2) model paths:", [v.path for v in m2.weights])
print("   SGD slot paths:", paths)
print("   duplicated slot paths:", [p for p, c in Counter(paths).items() if c > 1])
# Auto names depend on process history.
d1 = layers.Dense(1); d2 = layers.Dense(1)
print("3) auto-named layers:", d1.name, d2.name, "(a global per-name counter)")
# Seed generator path not under its layer name
dr = layers.Dropout(0.1, name="mydrop"); dr2 = layers.Dropout(0.1, name="mydrop2")
print("4) seed state paths:", dr.seed_generator.state.path, dr2.seed_generator.state.path)
