#!/usr/bin/env bash
# autotune export: study 'fixture', trial 1 (z0 fp32 mb2x2),
# tuned for 1 CPU rank(s) on one node.
#
#   ./launch.sh train.py [your script's arguments]                     # deepspeed launcher
#   LAUNCHER=torchrun ./launch.sh train.py [your script's arguments]   # torchrun
#
# The deepspeed launcher's rendezvous port is MASTER_PORT (29500 unless set: give another
# where a second job on the node holds it); torchrun --standalone picks a free one.
# Your script hands the config to deepspeed.initialize(config=...); this script passes
# its path as --deepspeed_config (change the flag below if your script reads another one).
set -euo pipefail
CONFIG="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/ds_config.json"
SCRIPT="${1:?usage: $0 train.py [arguments of your script]}"
shift
# The probes ran with this many intra-op threads per rank.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
case "${LAUNCHER:-deepspeed}" in
  deepspeed)
    exec deepspeed --num_gpus=1 --master_port "${MASTER_PORT:-29500}" \
      "$SCRIPT" --deepspeed_config "$CONFIG" "$@" ;;
  torchrun)
    exec torchrun --standalone --nproc-per-node=1 \
      "$SCRIPT" --deepspeed_config "$CONFIG" "$@" ;;
  *) echo "LAUNCHER must be deepspeed or torchrun, got ${LAUNCHER}" >&2; exit 2 ;;
esac
