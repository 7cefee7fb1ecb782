#!/usr/bin/env bash
# CI, after the test suite, with the built wheel installed as users install it (pip install
# ., not editable): from a folder outside the checkout, `autotune space`, then a short study
# of the default space whose probes include an FSDP2 one, to an export. Exits 1 with one line
# saying what failed.
#
# Which candidates a short study probes first: autotune's own sampler gives each ZeRO stage
# one probe first and ranks FSDP2 (a stage-3 candidate) against ZeRO-3 by a prediction
# calibrated on this machine, so whether FSDP2 is among the first probes depends on the
# machine. Optuna's RandomSampler draws a candidate's backend first, from its seed alone:
# with seed 313 the first trial is an FSDP2 candidate and the second a DeepSpeed one.
set -euo pipefail
checkout="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"

fail() {
  echo "installed wheel: $1" >&2
  exit 1
}

# Installed, not editable: the module lies in site-packages (which may sit inside the
# checkout, as CI's .venv does), not in the checkout's autotune/, and pip recorded no
# editable install (PEP 610's direct_url.json).
where="$(python - <<'WHERE'
import json
from importlib.metadata import distribution

import autotune

url = distribution("autotune").read_text("direct_url.json") or "{}"
editable = json.loads(url).get("dir_info", {}).get("editable", False)
print(("editable " if editable else "") + autotune.__file__)
WHERE
)"
case "$where" in
  editable\ * | "$checkout"/autotune/*)
    fail "autotune is imported from the checkout ($where), not the installed wheel" ;;
esac
autotune space --gpus 2 >space.log 2>&1 \
  || fail "autotune space --gpus 2 failed: $(tail -n 3 space.log)"
autotune run --workload gpt-tiny --gpus 2 --budget 5m --sampler random --seed 313 \
  --max-trials 2 --no-confirm --warmup-steps 1 --timed-steps 2 --max-timed-steps 3 --quiet \
  >run.log 2>&1 || fail "autotune run failed: $(tail -n 5 run.log)"
autotune status --json >status.json 2>status.log \
  || fail "autotune status --json failed: $(tail -n 3 status.log)"
python - <<'CHECK' || { echo "run.log, last lines:"; tail -n 20 run.log; exit 1; } >&2
"""An FSDP2 probe measured (docs/json.md: trials[].candidate.backend, status) and the
best's config exported beside summary.md."""
import json
import sys
from pathlib import Path

status = json.loads(Path("status.json").read_text(encoding="utf-8"))
trials = status["trials"]
measured = [t for t in trials if t["candidate"] and t["status"] == "ok" and t["samples_per_s"]]
if not any(t["candidate"]["backend"] == "fsdp2" for t in measured):
    found = ", ".join(f"{t['label']}: {t['status']}" for t in trials) or "no trial"
    sys.exit(f"installed wheel: no FSDP2 probe measured ({found}); if Optuna's RandomSampler "
             "changed, pick a --seed in .ci/installed_wheel.sh whose first trial is FSDP2")
best = next((t for t in trials if t["best"]), None)
if best is None:
    sys.exit("installed wheel: the study has no best trial, so nothing was exported")
config = {"fsdp2": "fsdp2_config.json"}.get(best["candidate"]["backend"], "ds_config.json")
folder = Path("trials/gpt-tiny/best")
absent = [name for name in (config, "launch.sh", "summary.md") if not (folder / name).is_file()]
if absent:
    sys.exit(f"installed wheel: the export {folder} lacks {', '.join(absent)}")
print(f"installed wheel: measured {', '.join(t['label'] for t in measured)}; exported {config}")
CHECK
