"""bench/compare_stacks.py: the side-by-side tables read from each bench's JSON."""

import json
import os
import sys

sys.path.insert(
  0,
  os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"
  ),
)
import compare_stacks  # pylint: disable=g-import-not-at-top,wrong-import-position


def _write(directory, name, data):
  with open(os.path.join(directory, name), "w") as f:
    json.dump(data, f)


def _core(ratio):
  return {
    "kinds": {
      "resource": {
        "targets": [
          {
            "target": "device snapshot / hand-written snapshot",
            "bound": "<= 1.1x",
            "ratio_median": ratio,
            "ratio_min": ratio - 0.01,
          }
        ],
        "summary": {"device snapshot": {"median_ms": 2 * ratio}},
        "raw": {
          "numpy copy into warm buffers": {"seconds": [1.0, 2.0, 4.0]},
          "host snapshot": {"seconds": [1.5, 2.0, 2.0]},
          "host restore": {"seconds": [0.1, 0.1, 0.1]},
          "update (steady)": {"seconds": [1.0, 1.0, 1.0]},
          "update after host restore": {"seconds": [2.0, 2.0, 2.0]},
        },
      }
    }
  }


def test_each_stack_in_its_column_and_missing_ones_as_dashes(tmp_path, capsys):
  _write(str(tmp_path), "bench_core_tf115.json", _core(1.04))
  _write(str(tmp_path), "bench_core_tf221.json", _core(0.5))
  scale = [
    {
      "kind": "packed",
      "n": 1000,
      "resource": True,
      "build": 10.3,
      "ops_per_var": 18.3,
      "first_snapshot": 1.2,
      "first_restore": 1.25,
      "slot_snapshot": [0.002, 0.003, 0.001],
      "slot_restore": [0.004, 0.002, 0.002],
    }
  ]
  _write(str(tmp_path), "bench_scale_tf221.json", scale)
  row = {"variant": "in-step", "overhead": 0.041, "median_us_per_step": 589.4}
  _write(
    str(tmp_path),
    "bench_training_tf115.json",
    {"models": {"demo": {"rows": [row]}}},
  )
  assert compare_stacks.main([str(tmp_path)]) == 0
  out = capsys.readouterr().out
  assert (
    "| resource: device snapshot / hand-written snapshot (<= 1.1x) "
    "| 1.04 (1.03) | 0.50 (0.49) |" in out
  )
  assert "| resource: device snapshot, median ms | 2.1 | 1.0 |" in out
  # Medians 2.0 / 2.0; per round 1.5, 1.0, 0.5: paired median 1.0.
  assert (
    "| resource: host snapshot / warm memcpy, median (paired per round) "
    "| 1.00 (1.00) |" in out
  )
  # The restore plus what the update after it pays over a steady one:
  # 1.1 each round, over 1, 2, 4.
  assert (
    "| resource: host restore + its deferred copy / warm memcpy, median "
    "(paired per round) | 0.55 (0.55) |" in out
  )
  assert (
    "| resource 1000 packed | - | 10.30 s, 18.3 ops/var; first 1.200 / "
    "1.250 s; slots 1-3 0.006 / 0.008 s |" in out
  )
  assert (
    "| demo model, in-step: overhead (median us/step) | +4.1% (589) | - |"
    in out
  )
  assert "bench_setup" not in out  # no stack has it


def test_no_json_at_all_is_an_error(tmp_path, capsys):
  assert compare_stacks.main([str(tmp_path), "--stacks", "a", "b"]) == 2
  assert "No <bench>_<stack>.json for stacks ['a', 'b']" in (
    capsys.readouterr().err
  )
