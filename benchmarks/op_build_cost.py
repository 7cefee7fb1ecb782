"""Wall and CPU time of the first build of DeepSpeed's ops, with and without autotune's op
compiler (``autotune.backends.deepspeed._op_pch``: a precompiled torch header for an op of
many torch sources, objects shared between ops that compile the same source).

Each build starts from nothing: a new op folder (``TORCH_EXTENSIONS_DIR``) and a new cache
(``XDG_CACHE_HOME``: the compiler's wrappers), in a process of its own that runs
``ensure_deepspeed_ops`` as ``autotune run`` does before its first probe. "without" replaces
the op compiler by nothing, so torch builds each op as it would without autotune; both
keep everything else (debug information off, the op locks). The two arms alternate, the
first arm of each pair swapped, as the machine's load drifts.

Reproduce (about 4 minutes a build on 2 idle cores for the CPU ops)::

    python benchmarks/op_build_cost.py --pairs 2 --targets cpu \
        --out benchmarks/data/op_build_cost.json

``--targets cpu,nvme`` adds the async I/O op (libaio-dev needed) that NVMe offload uses.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUILD = """
import contextlib, json, sys, time
from autotune.hardware import detect
import autotune.backends.deepspeed.ops as ops
if sys.argv[1] == "without":
    ops.op_pch.compiling = lambda *args, **kwargs: contextlib.nullcontext()
targets = {t for t in sys.argv[2].split(",") if t}
started = time.monotonic()
report = ops.ensure_deepspeed_ops(detect(), offload_targets=targets)
print(json.dumps({"built": report.built, "unavailable": report.unavailable,
                  "ensure_s": time.monotonic() - started}))
"""
ARMS = ("with", "without")


def build(arm: str, targets: str) -> dict[str, object]:
    """One build from nothing in a fresh process: its wall time, the CPU of its whole
    process tree (compilers included) and what it built."""
    with tempfile.TemporaryDirectory() as ops_dir, tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCH_EXTENSIONS_DIR": ops_dir, "XDG_CACHE_HOME": cache}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", BUILD, arm, targets],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        wall_s = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"the {arm} build failed:\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"arm": arm, "wall_s": round(wall_s, 1), "cpu_s": round(cpu_s, 1), **report}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2, help="builds of each arm")
    parser.add_argument("--targets", default="cpu", help="offload targets: cpu, nvme, cpu,nvme")
    parser.add_argument("--out", type=Path, help="JSON file for the builds and their medians")
    args = parser.parse_args()
    runs = []
    for pair in range(args.pairs):
        for arm in ARMS if pair % 2 == 0 else ARMS[::-1]:
            run = build(arm, args.targets)
            runs.append(run)
            print(
                f"{arm:>7}: {run['wall_s']:6.1f} s wall, {run['cpu_s']:6.1f} s CPU, "
                f"built {', '.join(run['built'])}",  # type: ignore[arg-type]
                flush=True,
            )
    medians = {
        arm: {
            key: statistics.median(float(r[key]) for r in runs if r["arm"] == arm)  # type: ignore[arg-type]
            for key in ("wall_s", "cpu_s")
        }
        for arm in ARMS
    }
    saved = medians["without"]["wall_s"] - medians["with"]["wall_s"]
    print(
        f"median wall: with {medians['with']['wall_s']:.1f} s, without "
        f"{medians['without']['wall_s']:.1f} s: the op compiler saves {saved:.1f} s"
    )
    if args.out is not None:
        document = {
            "command": "python benchmarks/op_build_cost.py " + " ".join(sys.argv[1:]),
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "targets": args.targets,
            "runs": runs,
            "medians": medians,
            "saved_wall_s": round(saved, 1),
        }
        args.out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
