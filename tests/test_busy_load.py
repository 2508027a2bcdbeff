"""bench/busy_load.py: the benchmarks' defined background load."""

import os
import sys

import pytest

sys.path.insert(
  0,
  os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"
  ),
)
import busy_load  # pylint: disable=g-import-not-at-top,wrong-import-position


def _gone(pid):
  return not os.path.exists("/proc/%d" % pid)


def test_a_pinned_load_binds_process_i_to_cpu_i_and_stops_them():
  allowed = sorted(os.sched_getaffinity(0))
  with busy_load.Load(2, "spin", pin=True) as load:
    pids = load.pids
    assert len(pids) == 2
    expected = [allowed[i % len(allowed)] for i in range(2)]
    assert load.cpus == expected
    assert [os.sched_getaffinity(pid) for pid in pids] == [
      {cpu} for cpu in expected
    ]
    assert "pinned to CPUs %s" % ",".join(map(str, expected)) in (
      load.describe()
    )
    assert "2 running" in load.describe()
  assert all(_gone(pid) for pid in pids)
  assert os.sched_getaffinity(0) == set(allowed)  # the benchmark is not bound


def test_an_unpinned_load_leaves_placement_to_the_scheduler():
  allowed = os.sched_getaffinity(0)
  with busy_load.Load(1, "spin") as load:
    (pid,) = load.pids
    assert os.sched_getaffinity(pid) == allowed
    assert load.cpus == []
    assert "unpinned" in load.describe()
  assert _gone(pid)


def test_no_load_says_so():
  with busy_load.Load(0, pin=True) as load:
    assert load.pids == []
    assert load.describe().startswith("load: none started (--load 0)")


def test_an_unknown_load_kind_is_refused():
  with pytest.raises(ValueError, match="load kind must be one of"):
    busy_load.Load(1, "sleep")
