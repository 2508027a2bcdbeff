#!/usr/bin/env python
"""Side-by-side tables of the same benches on two stacks, from their --json.

Reads `DIR/<bench>_<stack>.json` as written by each `bench/bench_*.py --json`
(for example by bench/run_both_stacks.sh, see bench/README.md) and
prints one Markdown table per bench: its headline figures (the ratios it
checks against its targets, and the times they come from) on each stack, in
one row per figure. It measures nothing and needs no TensorFlow.

    python bench/compare_stacks.py bench/results/2026-11-25_sidebyside
    python bench/compare_stacks.py DIR --stacks tf115 tf221
"""

import argparse
import json
import os
import statistics
import sys


def _load(directory, bench, stack):
  path = os.path.join(directory, "%s_%s.json" % (bench, stack))
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _fmt(value, spec):
  if value is None:
    return "-"
  if isinstance(value, bool):
    return "yes" if value else "no"
  return format(value, spec)


def core_rows(data):
  """bench_core: each target's ratio of medians (of minimums), per kind."""
  rows = []
  for kind in ("ref", "resource"):
    got = data["kinds"].get(kind)
    if not got:
      continue
    for t in got["targets"]:
      rows.append(
        (
          "%s: %s (%s)" % (kind, t["target"], t["bound"]),
          "%s (%s)"
          % (_fmt(t["ratio_median"], ".2f"), _fmt(t["ratio_min"], ".2f")),
        )
      )
    raw = dict((n, r.get("seconds")) for n, r in got.get("raw", {}).items())
    warm = raw.get("numpy copy into warm buffers")
    if raw.get("host restore") and raw.get("update after host restore"):
      # A resource variable's restore defers its copy to the next write
      # (copy on write): the update after it pays what the steady one does
      # not.
      raw["host restore + its deferred copy"] = [
        r + after - steady
        for r, after, steady in zip(
          raw["host restore"],
          raw["update after host restore"],
          raw["update (steady)"],
        )
      ]
    for name in (
      "host snapshot",
      "host restore",
      "host restore + its deferred copy",
    ):
      times = raw.get(name)
      if warm and times:
        rows.append(
          (
            "%s: %s / warm memcpy, median (paired per round)" % (kind, name),
            "%s (%s)"
            % (
              _fmt(statistics.median(times) / statistics.median(warm), ".2f"),
              _fmt(
                statistics.median(t / w for t, w in zip(times, warm)), ".2f"
              ),
            ),
          )
        )
    summary = got["summary"]
    for name in (
      "device snapshot",
      "hand-written snapshot",
      "device restore",
      "hand-written restore",
      "host snapshot",
      "host restore",
      "numpy copy into warm buffers",
    ):
      if name in summary:
        rows.append(
          (
            "%s: %s, median ms" % (kind, name),
            _fmt(summary[name]["median_ms"], ".1f"),
          )
        )
  return rows


def scale_rows(data):
  """bench_scale: per (variables, kind): build seconds, ops per variable, the
  first snapshot / restore, and the first calls into slots 1-3 together."""
  rows = []
  for r in data:
    key = "%s %d %s" % (
      "resource" if r.get("resource", True) else "ref",
      r["n"],
      r["kind"],
    )
    cell = "%s s, %s ops/var" % (
      _fmt(r.get("build"), ".2f"),
      _fmt(r.get("ops_per_var"), ".1f"),
    )
    if "first_snapshot" in r:
      cell += "; first %s / %s s" % (
        _fmt(r["first_snapshot"], ".3f"),
        _fmt(r["first_restore"], ".3f"),
      )
    if r.get("slot_snapshot"):
      cell += "; slots 1-%d %s / %s s" % (
        len(r["slot_snapshot"]),
        _fmt(sum(r["slot_snapshot"]), ".3f"),
        _fmt(sum(r.get("slot_restore") or [0]), ".3f"),
      )
    rows.append((key, cell))
  return rows


def setup_rows(data):
  """bench_setup: build seconds, ops per variable and ratio to Adam."""
  rows = []
  for r in data:
    key = "%s %d %s" % (r["variables"], r["n"], r["built"])
    rows.append(
      (
        "%s: s (x Adam), ops/var" % key,
        "%s (%sx), %s"
        % (
          _fmt(r["seconds"], ".2f"),
          _fmt(r.get("ratio_to_adam"), ".2f"),
          _fmt(r.get("ops_per_variable"), ".1f"),
        ),
      )
    )
  return rows


def training_rows(data):
  """bench_training: each variant's overhead over the bare step (median),
  per model (older runs: one model, `rows` at the top)."""
  models = data.get("models") or {"demo": data}
  rows = []
  for model, got in models.items():
    for r in got["rows"]:
      rows.append(
        (
          "%s model, %s: overhead (median us/step)" % (model, r["variant"]),
          "%s (%s)"
          % (
            _fmt(100 * r["overhead"], "+.1f") + "%",
            _fmt(r["median_us_per_step"], ".0f"),
          ),
        )
      )
  return rows


def disk_rows(data):
  """bench_disk: each writer's MiB/s (and ratio to raw h5py), the stall."""
  rows = []
  for case, got in data["throughput"].items():
    for writer, r in got.items():
      if not isinstance(r, dict) or "median_s" not in r:
        continue
      speed = got["bytes"] / r["median_s"] / 2**20
      cell = _fmt(speed, ".0f")
      if "ratio_median" in r:
        cell += " (%sx)" % _fmt(r["ratio_median"], ".2f")
      rows.append(("%s, %s: MiB/s (time / raw h5py)" % (case, writer), cell))
  stall = data.get("stall", {})
  for name in ("ratio_snapshot_median", "ratio_step_median"):
    if name in stall:
      rows.append(
        ("stall: disk / host, %s" % name[6:], _fmt(stall[name], ".2f"))
      )
  return rows


def ensemble_rows(data):
  """bench_ensemble: each way's median ms per member count."""
  rows = []
  for r in data["results"]:
    for way in r["ways"]:
      rows.append(
        (
          "%d members: %s, median ms" % (r["members"], way["name"]),
          _fmt(way["median_ms"], ".1f"),
        )
      )
  return rows


def rewire_rows(data):
  """bench_rewire: the past's cost over a forward pass, and the medians."""
  rows = [
    ("past alone / forward", _fmt(data["past_alone_over_forward"], ".3f")),
    (
      "past next to current, extra / forward",
      _fmt(data["past_extra_next_to_current_over_forward"], ".3f"),
    ),
  ]
  for name, ms in data["median_ms"].items():
    rows.append(("%s, median ms" % name, _fmt(ms, ".1f")))
  return rows


BENCHES = (
  ("bench_core", core_rows),
  ("bench_scale", scale_rows),
  ("bench_setup", setup_rows),
  ("bench_training", training_rows),
  ("bench_disk", disk_rows),
  ("bench_ensemble", ensemble_rows),
  ("bench_rewire", rewire_rows),
)


def table(bench, rows_of, directory, stacks):
  """The Markdown table of one bench, or None if no stack has its JSON."""
  columns = []
  for stack in stacks:
    data = _load(directory, bench, stack)
    columns.append(dict(rows_of(data)) if data is not None else {})
  if not any(columns):
    return None
  keys = []
  for column in columns:
    keys.extend(k for k in column if k not in keys)
  lines = [
    "| %s | %s |" % (bench, " | ".join(stacks)),
    "| --- | %s |" % " | ".join("---:" for _ in stacks),
  ]
  for k in keys:
    lines.append(
      "| %s | %s |" % (k, " | ".join(c.get(k, "-") for c in columns))
    )
  return "\n".join(lines)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("directory")
  p.add_argument("--stacks", nargs="+", default=["tf115", "tf221"])
  args = p.parse_args(argv)
  printed = 0
  for bench, rows_of in BENCHES:
    got = table(bench, rows_of, args.directory, args.stacks)
    if got is not None:
      print(got)
      print()
      printed += 1
  if not printed:
    print(
      "No <bench>_<stack>.json for stacks %s in %s."
      % (args.stacks, args.directory),
      file=sys.stderr,
    )
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
