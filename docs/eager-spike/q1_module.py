"""Q1: tf.Module variables, their order, names and attribute paths (keys)."""
from common import *

class Block(tf.Module):
  def __init__(self, n, name=None):
    super().__init__(name=name)
    self.w = tf.Variable(tf.ones([n, n]), name="w")
    self.b = tf.Variable(tf.zeros([n]), name="b")
    self.step = tf.Variable(0, name="step", trainable=False)

class Net(tf.Module):
  def __init__(self):
    super().__init__(name="net")
    self.layers = [Block(2, name="blk"), Block(3, name="blk")]
    self.alias = self.layers[0].w          # same variable reachable twice

net = Net()
print("module.variables:", [v.name for v in net.variables])
print("trainable_variables:", [v.name for v in net.trainable_variables])
print("names unique:", len({v.name for v in net.variables}) == len(net.variables))
paths = list(net._flatten(predicate=lambda v: isinstance(v, tf.Variable), with_path=True))
print("attribute paths (with_path=True):")
for p, v in paths: print("   %-22s -> %s" % ("/".join(map(str, p)), v.name))
print("deduplicated by identity in .variables:", len(net.variables), "vs paths", len(paths))
