"""Host ratios and device targets of every bench_core JSON in this folder."""

import glob
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = [
  ("snap", "host snapshot / numpy copy into warm buffers"),
  (
    "snap paired",
    "host snapshot / numpy copy into warm buffers, median of per-round ratios",
  ),
  ("restore", "host restore / numpy copy into warm buffers"),
  (
    "restore+copy",
    "host restore + its deferred copy / numpy copy into warm buffers",
  ),
]
for path in sorted(glob.glob(os.path.join(HERE, "bench_core_*.json"))):
  d = json.load(open(path))
  for kind in ("ref", "resource"):
    k = d["kinds"][kind]
    e = k["explanatory"]
    dev = dict((t["target"], t["ratio_median"]) for t in k["targets"])
    memcpy = k["summary"]["numpy copy into warm buffers"]["median_ms"]
    print(
      "%-32s %-8s %s  memcpy %.1f ms  device snap/restore %.2f/%.2f"
      % (
        os.path.basename(path)[11:-5],
        kind,
        "  ".join("%s %.2f" % (n, e[key]) for n, key in KEYS),
        memcpy,
        dev["device snapshot / hand-written snapshot"],
        dev["device restore / hand-written restore"],
      )
    )
