"""The session a call runs in, and the callables it runs there.

`resolve` finds the session as `Variable.load` and `Tensor.eval` do:
`session=None` means the default session. A `MonitoredSession` is unwrapped to
its raw `tf.Session`, so the store's own copies do not count as training steps
for the session's hooks (inside a hook, `run_context.session` is already raw).

`run_cached` runs a fetch through a callable made once per session.

    sess = resolve(session, store.graph, "snapshot")
    run_cached(sess, snapshot_op)
"""

import threading

from snapstore._tf import callable_with_exact_feeds
from snapstore._tf import raw_session
from snapstore._tf import session_closed
from snapstore._tf import session_under
from snapstore._tf import tf
from snapstore.engines.graph import attached
from snapstore.core import checks
from snapstore import errors


def resolve(session, graph, what):
  """Returns the raw session to run `what` in, checked against `graph`.

  Args:
    session: A `tf.Session`, a `MonitoredSession` or similar wrapper, or None
      for the default session.
    graph: The graph the session must run.
    what: The calling method's name, for messages.

  Raises:
    NoSessionError: `session` is None and there is no default session, or
      it is closed (checked before anything runs, so a call that gets a
      closed session has changed nothing).
    GraphMismatchError: The session runs another graph.
    TypeError: `session` is not a session.
  """
  if session is None:
    session = tf.get_default_session()
    if session is None:
      raise errors.NoSessionError(
        "%s() needs a session: pass session=..., or call it inside "
        "`with session.as_default():`." % what
      )
  raw = _unwrap(session)
  if not (hasattr(raw, "run") and hasattr(raw, "graph")):
    raise TypeError(
      "session must be a tf.Session or MonitoredSession, got %r." % (session,)
    )
  checks.same_graph(
    raw,
    graph,
    "%s()'s session" % what,
    fix="Pass a session created on the store's graph (store.graph).",
  )
  if session_closed(session_under(raw)):
    raise errors.NoSessionError(
      "%s()'s session is closed; nothing was run. Pass an open session." % what
    )
  return raw


def _unwrap(session):
  raw = raw_session(session)
  if raw is None:
    raise errors.NoSessionError("The MonitoredSession is closed.")
  return raw


def run_cached(session, fetches, feed_list=None, values=()):
  """Runs `fetches` through a callable made once per session.

  A callable skips most of `Session.run`'s per-call Python work and adds no
  graph ops. TF 1.15's `make_callable` with a `feed_list` only wraps
  `Session.run`, so a run with feeds (which must fetch one op, and get the
  exact dtype and shape of each placeholder) gets a real one from
  `Session._make_callable_from_options`, several times faster for small
  variables.

  The callable is cached on the session itself, keyed by the ids of the fetch
  and of each feed (the cache holds them, so the ids stay theirs): a callable
  refers to its session, so a cache anywhere else would keep every session
  alive. Sessions without `make_callable` fall back to `run`.
  """
  # By the feeds themselves, not the list: a caller that passes a new list of
  # the same placeholders on every call must not get a new callable each time.
  key = (id(fetches), tuple(id(f) for f in feed_list) if feed_list else ())
  entry = _CALLABLES.get(session, {}).get(key)
  if entry is not None:
    return entry[0](*values)
  if not hasattr(session, "make_callable"):
    feeds = dict(zip(feed_list, values)) if feed_list else None
    return session.run(fetches, feed_dict=feeds)
  with _LOCK:
    cache = _CALLABLES.get(session)
    if cache is None:
      cache = {}
      _CALLABLES.set(session, cache)
    # The exact-feeds callable runs one op; tensors to fetch (with feeds)
    # go through `make_callable`.
    fn = (
      callable_with_exact_feeds(session, feed_list, fetches)
      if feed_list and isinstance(fetches, tf.Operation)
      else None
    )
    if fn is None:
      fn = session.make_callable(fetches, feed_list=feed_list)
    entry = cache[key] = (fn, fetches, feed_list)
  return entry[0](*values)


_CALLABLES = attached.PerObject("callables")  # on each session: {key: entry}
_LOCK = threading.Lock()
