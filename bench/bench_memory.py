#!/usr/bin/env python
"""Benchmark: a store's peak memory and copy time by model size (issue 38).

For each engine, mode and size (default 64 MiB, 256 MiB and 1 GiB in 16
float32 variables), one child process (tests/memory_child.py, the memory
test's own) builds the model, takes two snapshots (`max_to_keep=2`; disk
mode with `memory_budget=1`, so each goes to the spill file), restores the
first and checks it bit for bit. Reported:

  held          the models' worth of bytes the mode must hold: host 2 (the
                snapshots), disk 2 (the one kept and the one on its way to
                the file), device 2 (its slots)
  peak / held   peak RSS (`ru_maxrss`) minus the RSS once the model exists,
                over the held bytes: 1.00 is the floor
  extra         the same peak over the held bytes, in MiB
  snapshot, restore
                medians of `--rounds` calls after the first (a snapshot over
                a held tag, a restore of a held one: disk mode's restore
                reads the file), in ms and as a multiple of a warm memcpy
                of the same bytes (np.copyto into preallocated arrays,
                timed first, its buffers freed before the store's calls)

Variables of 128 KiB to 32 MiB (a 64 or 256 MiB model in 16) are where
glibc's malloc raises its mmap threshold as large blocks are freed: a
freed per-variable buffer then stays in the heap, resident, instead of
going back to the system, and shows in the peak. `--mmap-threshold BYTES`
fixes the threshold for the children (MALLOC_MMAP_THRESHOLD_) to tell that
apart from copies the store keeps.

A graph engine child runs under `--graph-python` (default: this
interpreter, in graph mode on TF 2.x), an eager one under
`--eager-python` (default: this interpreter; TF 2.x only). Memory is stable
on a loaded machine; times are not.

    .venv-tf2/bin/python bench/bench_memory.py --graph-python .venv/bin/python
    .venv-tf2/bin/python bench/bench_memory.py --sizes 64,256,1024,4096
    .venv/bin/python bench/bench_memory.py --modes host --sizes 256 --json out.json
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CHILD = os.path.join(_ROOT, "tests", "memory_child.py")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--sizes", default="64,256,1024", help="MiB, comma-separated")
  p.add_argument("--vars", type=int, default=16)
  p.add_argument("--modes", default="device,host,disk")
  p.add_argument("--engines", default=None, help="default: graph and eager")
  p.add_argument("--graph-python", default=sys.executable)
  p.add_argument("--eager-python", default=sys.executable)
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--json", default=None, help="write the rows here")
  p.add_argument(
    "--mmap-threshold",
    type=int,
    default=None,
    help="MALLOC_MMAP_THRESHOLD_ for the children (glibc), in bytes",
  )
  return p.parse_args(argv)


def _has_eager(python):
  """Whether `python`'s TensorFlow is 2.x (has the eager engine)."""
  out = subprocess.run(
    [python, "-c", "import tensorflow as tf; print(tf.__version__)"],
    stdout=subprocess.PIPE,
    stderr=subprocess.DEVNULL,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
  )
  version = out.stdout.decode().strip().splitlines()[-1:]
  return bool(version) and not version[0].startswith("1."), version


def run_child(python, engine, mode, mib, count, rounds, threshold=None):
  env = dict(
    os.environ,
    TF_CPP_MIN_LOG_LEVEL="3",
    PYTHONPATH=os.pathsep.join(
      [_ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    ),
  )
  if threshold is not None:
    env["MALLOC_MMAP_THRESHOLD_"] = str(threshold)
  with tempfile.TemporaryDirectory() as d:
    out = subprocess.run(
      [python, _CHILD, engine, mode, "--mib", str(mib), "--vars", str(count)]
      + ["--dir", d, "--time", str(rounds)],
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      env=env,
      cwd=_ROOT,
    )
  text = out.stdout.decode("utf-8", "replace")
  if out.returncode != 0:
    raise RuntimeError("%s %s %s MiB failed:\n%s" % (engine, mode, mib, text))
  return json.loads(text.strip().splitlines()[-1])


def row(result):
  core, times, m = result["core"], result["times"], result["nbytes"]
  memcpy = times["memcpy_warm"]
  return dict(
    engine=result["engine"],
    mode=result["mode"],
    mib=m / float(1 << 20),
    held=core["held_models"],
    ratio=core["ratio"],
    extra_mib=(core["extra_models"] - core["held_models"]) * m / (1 << 20),
    snapshot_ms=times["snapshot_warm"] * 1e3,
    snapshot_x=times["snapshot_warm"] / memcpy,
    restore_ms=times["restore_warm"] * 1e3,
    restore_x=times["restore_warm"] / memcpy,
    memcpy_ms=memcpy * 1e3,
    ns_per_byte=times["snapshot_warm"] * 1e9 / m,
    exact=result["exact"],
  )


def main(argv=None):
  args = parse_args(argv)
  engines = args.engines.split(",") if args.engines else ["graph", "eager"]
  python = {"graph": args.graph_python, "eager": args.eager_python}
  versions = {}
  for engine in list(engines):
    eager, version = _has_eager(python[engine])
    versions[engine] = version
    if engine == "eager" and not eager:
      print(
        "eager: %s has TensorFlow %s, no eager engine"
        % (python[engine], version)
      )
      engines.remove(engine)
  rows = []
  print(
    "| engine | mode | model MiB | held | peak / held | extra MiB | "
    "snapshot ms (x memcpy) | restore ms (x memcpy) | memcpy ms | exact |"
  )
  print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
  for engine in engines:
    for mode in args.modes.split(","):
      for mib in args.sizes.split(","):
        r = row(
          run_child(
            python[engine],
            engine,
            mode,
            float(mib),
            args.vars,
            args.rounds,
            args.mmap_threshold,
          )
        )
        r["tensorflow"] = versions[engine]
        rows.append(r)
        print(
          "| %s (TF %s) | %s | %.0f | %d | %.2f | %+.0f | %.0f (%.2f) | "
          "%.0f (%.2f) | %.0f | %s |"
          % (
            engine,
            "".join(versions[engine]),
            mode,
            r["mib"],
            r["held"],
            r["ratio"],
            r["extra_mib"],
            r["snapshot_ms"],
            r["snapshot_x"],
            r["restore_ms"],
            r["restore_x"],
            r["memcpy_ms"],
            "yes" if r["exact"] else "NO",
          ),
          flush=True,
        )
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)
  return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
