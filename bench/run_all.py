#!/usr/bin/env python
"""Runs every benchmark script `bench/bench_*.py`, one after the other.

`make bench` runs this with the project's interpreter (.venv/bin/python). Each
script runs in its own process with its default arguments, so one benchmark's
memory and TensorFlow state cannot affect the next. New benchmarks are picked up
by name: add `bench/bench_<topic>.py` with a `--json PATH` option.

    .venv/bin/python bench/run_all.py                 # every bench_*.py
    .venv/bin/python bench/run_all.py core            # only names containing "core"
    .venv/bin/python bench/run_all.py --list
    .venv/bin/python bench/run_all.py --json-dir bench/results

Exits non-zero if a script fails (a missed performance target is reported in
the script's output, not as a failure).
"""

import argparse
import glob
import os
import subprocess
import sys
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))


def discover(patterns=()):
  scripts = sorted(glob.glob(os.path.join(BENCH_DIR, "bench_*.py")))
  if patterns:
    scripts = [
      s for s in scripts if any(p in os.path.basename(s) for p in patterns)
    ]
  return scripts


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument(
    "patterns",
    nargs="*",
    help="run only scripts whose file name contains one of these",
  )
  p.add_argument(
    "--list", action="store_true", help="list the scripts and exit"
  )
  p.add_argument(
    "--json-dir",
    default=None,
    help="pass --json DIR/<script name>.json to every script",
  )
  args = p.parse_args(argv)

  scripts = discover(args.patterns)
  if not scripts:
    print(
      "No bench/bench_*.py script matches %s." % (args.patterns or "anything"),
      file=sys.stderr,
    )
    return 2
  if args.list:
    for s in scripts:
      print(os.path.relpath(s))
    return 0

  env = dict(os.environ)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  failed = []
  for script in scripts:
    name = os.path.splitext(os.path.basename(script))[0]
    cmd = [sys.executable, script]
    if args.json_dir:
      os.makedirs(args.json_dir, exist_ok=True)
      cmd += ["--json", os.path.join(args.json_dir, name + ".json")]
    print("=" * 78)
    shown = [sys.executable, os.path.relpath(script)] + cmd[2:]
    print("$ %s" % " ".join(shown), flush=True)
    t0 = time.perf_counter()
    rc = subprocess.call(cmd, env=env)
    print(
      "-- %s: exit %d after %.0f s" % (name, rc, time.perf_counter() - t0),
      flush=True,
    )
    if rc != 0:
      failed.append(name)
  print("=" * 78)
  if failed:
    print("FAILED: %s" % ", ".join(failed))
    return 1
  print(
    "ran %d benchmark script(s): %s"
    % (len(scripts), ", ".join(os.path.basename(s) for s in scripts))
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
