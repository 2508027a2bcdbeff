"""What each program of README.md and docs/ must end with: its checks.

Run after a program's last block, in its namespace (tests/docs_blocks.py).
Keyed by the program's id (that of its `run` block: its page, two
underscores, its section and its number there). Every fragment (a block with
a hidden setup) has one; a complete program may assert in its own visible
code instead.
"""

CHECKS = {
  "how_to_rollback_tape__a_rollback_point_inside_the_step_snapshot_in_step_1": (
    "assert np.isfinite(past_loss), past_loss\n"
    # The bad step was rolled back: every weight is finite.
    "assert all(np.isfinite(v.numpy()).all() for v in model.weights)\n"
    "with np.load('model.npz') as f:\n"
    "  assert sorted(f.files) == sorted(store.keys), f.files\n"
  ),
  "getting_started_graph__a_session_loop_1": (
    "assert np.isfinite(past_loss), past_loss\n"
    # Its device snapshots went with the closed session; the file stays.
    "assert store.tags() == [], store.tags()\n"
    "with np.load('best.npz') as f:\n"
    "  assert sorted(f.files) == sorted(store.keys), f.files\n"
  ),
  "how_to_averages__the_same_in_graph_mode_1": (
    "assert np.isfinite(slow_loss) and np.isfinite(ema_loss)\n"
    # The guard's device snapshot went with the closed session.
    "assert store.tags() == [], store.tags()\n"
  ),
  # The fragments below run after their setups (hidden in README.md).
  "how_to_past_and_current__in_graph_mode_store_slots_past_and_"
  "snapstore_clone_1": (
    # The past is slot 0's initial parameters, bit for bit; the present is
    # one step later; after the refresh they agree.
    "assert np.array_equal(past, start)\n"
    "assert not np.allclose(current, past)\n"
    "current, past = sess.run([q, q_past], feed)\n"
    "assert np.array_equal(current, past)\n"
  ),
  "how_to_rollback_tape__options_1": (
    # The bad batch's step was undone: finite weights, and Keras counted
    # only the three good steps (the rollback puts `iterations` back too).
    "assert all(np.isfinite(v.numpy()).all() for v in model.weights)\n"
    "assert int(opt.iterations.numpy()) == 3, opt.iterations.numpy()\n"
  ),
  "how_to_target_networks__in_graph_mode_1": (
    "sess = tf.Session()\n"
    "sess.run([tf.global_variables_initializer(),"
    " tf.local_variables_initializer()])\n"
    "names = [v.op.name.split('/', 1)[1] for v in"
    " tf.trainable_variables('online')]\n"
    "live = lambda: dict(zip(names, sess.run(tf.trainable_variables())))\n"
    # Hard update: the target is the online network, bit for bit.
    "sess.run(train_op, feed)\n"
    "sess.run(hard_update)\n"
    "target, online = store.arrays('target', session=sess), live()\n"
    "assert sorted(target) == sorted(online), (sorted(target), names)\n"
    "for k in online:\n"
    "  assert target[k].tobytes() == online[k].tobytes(), k\n"
    # Soft update after the step: (1 - tau) * target + tau * online.
    "sess.run(train_and_update, feed)\n"
    "new_target, new_online = store.arrays('target', session=sess), live()\n"
    "for k in online:\n"
    "  assert not np.array_equal(new_online[k], online[k]), k\n"
    "  expect = (np.float32(1 - 0.005) * target[k]"
    " + np.float32(0.005) * new_online[k])\n"
    "  assert np.array_equal(new_target[k], expect), k\n"
  ),
  "how_to_target_networks__soft_updates_ddpg_sac_1": (
    # The target actor is a separate model holding the slot's values, bit
    # for bit, and it has moved away from the online actor.
    "separate = make_actor()\n"
    "separate.set_weights(target_weights)\n"
    "probe = np.random.RandomState(1).randn(5, 3).astype(np.float32)\n"
    "assert target_actor(probe).numpy().tobytes() == "
    "separate(probe).numpy().tobytes()\n"
    "assert not np.array_equal(target_actor(probe).numpy(), "
    "actor(probe).numpy())\n"
  ),
  "how_to_target_networks__hard_updates_dqn_1": (
    # The last step was a sync: the target is the online network.
    "held = store.arrays('target')\n"
    "for w in q_net.weights:\n"
    "  assert held[store.key_of(w)].tobytes() == w.numpy().tobytes()\n"
    "probe = np.random.RandomState(1).randn(5, 4).astype(np.float32)\n"
    "assert target_q(probe).numpy().tobytes() == "
    "q_net(probe).numpy().tobytes()\n"
  ),
  "how_to_rollback_session__a_rollback_point_in_every_step_s_run_"
  "snapshot_before_1": (
    # The step ran (its loss is not finite) and was undone, bit for bit:
    # weights, Adam's slots and beta powers, and the global step.
    "assert not np.isfinite(sess.run(loss, feed))\n"
    "end = sess.run(tf.global_variables())\n"
    "assert len(end) == len(start)\n"
    "for a, b in zip(start, end):\n"
    "  assert np.asarray(a).tobytes() == np.asarray(b).tobytes()\n"
    "assert sess.run(step) == 0\n"
  ),
  "how_to_rollback_session__a_rollback_point_in_every_step_s_run_"
  "snapshot_before_2": (
    # The gate skipped the copy; the restore went back to the initial
    # values, the newest start of a step with a finite loss (none yet).
    "assert not np.isfinite(value)\n"
    "end = sess.run(tf.global_variables())\n"
    "for a, b in zip(start, end):\n"
    "  assert np.asarray(a).tobytes() == np.asarray(b).tobytes()\n"
    "assert sess.run(step) == 0\n"
  ),
  "how_to_disk_mode__in_graph_mode_1": (
    "store.files.flush()\n"
    "assert os.path.exists('run7.h5')\n"
    "assert store.tags() == [tag], store.tags()\n"
    # A change undone from the snapshot, bit for bit.
    "net = tf.global_variables('net')\n"
    "sess.run([v.assign(v + 1.0) for v in net])\n"
    "store.restore(tag, session=sess)\n"
    "for a, b in zip(start, sess.run(net)):\n"
    "  assert a.tobytes() == b.tobytes()\n"
    "store.close()\n"
  ),
  "how_to_ensembles__in_graph_mode_every_member_in_one_session_run_1": (
    # Each member's probabilities are a numpy forward pass with the
    # weights its checkpoint holds; the combination is their mean and vote.
    "def forward(w):\n"
    "  h = np.maximum(0.0, batch.dot(w['dense/kernel']) + w['dense/bias'])\n"
    "  z = h.dot(w['dense_1/kernel']) + w['dense_1/bias']\n"
    "  e = np.exp(z - z.max(axis=1, keepdims=True))\n"
    "  return e / e.sum(axis=1, keepdims=True)\n"
    "tags = ['run_1', 'run_2', 'run_3']\n"
    "expect = [forward(weights[t]) for t in tags]\n"
    "assert list(result.members) == tags, list(result.members)\n"
    "for t, e in zip(tags, expect):\n"
    "  assert np.allclose(result.members[t]['probs'], e, atol=1e-5), t\n"
    "assert not np.allclose(expect[0], expect[1])\n"
    "assert np.allclose(result.combined['probs'], np.mean(expect, 0),"
    " atol=1e-5)\n"
    "labels = np.array([e.argmax(1) for e in expect])\n"
    "for row, label in zip(labels.T, result.combined['label']):\n"
    "  counts = np.bincount(row)\n"
    "  if counts.max() > 1:  # a majority\n"
    "    assert label == counts.argmax(), (row, label)\n"
  ),
}
