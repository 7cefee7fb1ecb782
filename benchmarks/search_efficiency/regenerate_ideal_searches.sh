#!/usr/bin/env bash
# Regenerate every ideal search of benchmarks/RESULTS.md ("An ideal search: how far probes
# alone go"): the ideal_search_*.json files of this folder's data/, each for the table,
# limit, noise and mode of the replay it bounds (regenerate_replays.sh, beside this), under
# the same name as that replay; each records its table by file name only (no path).
#
# Deterministic (fixed seeds), 20,000 repeats each. PYTHON overrides the interpreter
# (default python); the first argument the output folder (default this folder's data/). With
# --4-minutes as the second argument it runs instead the ideal searches on a 4-minute clock
# that bound the 4-minute replays (regenerate_replays.sh OUT --4-minutes): the
# ideal_search_*_240s*.json files, each probe its table row's own wall time.
set -euo pipefail

out=${1:-$(dirname "${BASH_SOURCE[0]}")/data}
mode=${2:-}
python=${PYTHON:-python}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

ideal() {  # ideal NAME ARGS...: write $out/ideal_search_NAME.json
    local name=$1
    shift
    local file="$out/ideal_search_$name.json"
    local start=$SECONDS
    "$python" benchmarks/search_efficiency/search_efficiency.py ideal "$@" --out "$file" \
        >/dev/null
    echo "$file ($((SECONDS - start)) s): ideal $*"
}

data=benchmarks/search_efficiency/data

if [ "$mode" = --4-minutes ]; then
    flags=(--budget-s 240)
    amx="$data/table_gpt-tiny-amx.json"
    ideal gpt-tiny_unlimited_240s --table "$data/table_gpt-tiny.json" "${flags[@]}"
    ideal gpt-tiny-amx_unlimited_240s --table "$amx" "${flags[@]}"
    ideal gpt-tiny-amx_unlimited_noise0.075_240s --table "$amx" --noise 0.075 "${flags[@]}"
    ideal gpt-tiny-amx_bimodal_240s --table "$amx" --noise 0.075 --bimodal "${flags[@]}"
    ideal gpt2-seq32_unlimited_240s --table "$data/table_gpt2-seq32.json" "${flags[@]}"
    ideal gpt2-seq32-amx_unlimited_240s --table "$data/table_gpt2-seq32-amx.json" "${flags[@]}"
    ideal dit-cpu_unlimited_noise-measured_240s --table "$data/table_dit-cpu.json" \
        --noise measured "${flags[@]}"
    ideal vision-script_unlimited_noise-measured_240s --table "$data/table_vision-script.json" \
        --noise measured "${flags[@]}"
    flags+=(--probe-s 15)
    ideal gpt-tiny-amx_unlimited_noise0.075_240s_probe15s --table "$amx" --noise 0.075 \
        "${flags[@]}"
    ideal dit-cpu_unlimited_noise-measured_240s_probe15s --table "$data/table_dit-cpu.json" \
        --noise measured "${flags[@]}"
    ideal vision-script_unlimited_noise-measured_240s_probe15s \
        --table "$data/table_vision-script.json" --noise measured "${flags[@]}"
    exit 0
fi

ideal gpt-tiny_unlimited --table "$data/table_gpt-tiny.json"
ideal gpt-tiny_1.5GiB --table "$data/table_gpt-tiny.json" --limit 1.5GiB
ideal gpt-tiny_48MiB --table "$data/table_gpt-tiny.json" --limit 48MiB
ideal gpt2-seq32_unlimited --table "$data/table_gpt2-seq32.json"
ideal gpt2-seq32-amx_unlimited --table "$data/table_gpt2-seq32-amx.json"
ideal gpt-tiny-amx_unlimited --table "$data/table_gpt-tiny-amx.json"
ideal gpt-tiny-amx_1.5GiB --table "$data/table_gpt-tiny-amx.json" --limit 1.5GiB
ideal gpt-tiny-amx_unlimited_noise0.075 --table "$data/table_gpt-tiny-amx.json" --noise 0.075
ideal gpt-tiny-amx_bimodal --table "$data/table_gpt-tiny-amx.json" --noise 0.075 --bimodal
ideal gpt-tiny-amx_48MiB --table "$data/table_gpt-tiny-amx.json" --limit 48MiB
ideal dit-cpu_unlimited --table "$data/table_dit-cpu.json"
ideal dit-cpu_unlimited_noise-measured --table "$data/table_dit-cpu.json" --noise measured
ideal dit-cpu_512MiB --table "$data/table_dit-cpu.json" --limit 512MiB
ideal vision-script_unlimited --table "$data/table_vision-script.json"
ideal vision-script_unlimited_noise-measured --table "$data/table_vision-script.json" \
    --noise measured
