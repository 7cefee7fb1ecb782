#!/usr/bin/env bash
# Regenerate every search-efficiency replay of benchmarks/RESULTS.md (section "Search
# efficiency"): the search_efficiency_*.json files of this folder's data/, each with the
# command and arguments that produced it, under the same file name. A replay records its
# table by file name only (the table lies beside it), so the files hold no path.
#
# The replays are deterministic (fixed seeds; the same bytes run after run), so a change
# that should not move them (a refactor) can be checked by regenerating them before and
# after it and comparing byte for byte, from the repository root:
#
#     bash benchmarks/search_efficiency/regenerate_replays.sh /tmp/replays_after
#     diff -r /tmp/replays_before /tmp/replays_after     # no output: byte-identical
#
# or by regenerating in place (the default folder, benchmarks/search_efficiency/data) and
# checking that `git diff benchmarks/search_efficiency/data` is empty.
#
# Each replay takes 30-60 s on two idle CPU cores (all 18: 5-7 min). PYTHON overrides
# the interpreter (default python). Arguments not given take the defaults of
# benchmarks/search_efficiency/search_efficiency.py: --max-probes 40, --noise 0.03,
# --confirmation-rule lower+simpler+steadier, --limit 64GiB.
#
# With --100-seeds as the second argument it runs instead the 100-seed replays that
# RESULTS.md's 100-seed counts and docs/search.md's headline quote (the
# search_efficiency_*_100seeds.json files: the tuner's rule and, for the "before" column
# of "The lower of median and mean in the round", median+simpler+steadier): about 2.5 min
# of CPU each, 14 in all.
#
# With --4-minutes as the second argument it runs instead the replays of a 4-minute run
# (--budget-s 240: the search_efficiency_*_240s*.json files, RESULTS.md's "A short study in
# seconds"): each probe takes its table row's own wall time, or (_probe15s) the table's
# times scaled to a 15 s median; 15-50 s each (100 s for the two of 100 seeds), 13 in all.
set -euo pipefail

out=${1:-$(dirname "${BASH_SOURCE[0]}")/data}
seeds=${2:-}
python=${PYTHON:-python}
mkdir -p "$out"
out=$(cd "$out" && pwd)
# The commands name the tables from the repository root.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

replay() {  # replay NAME ARGS...: write $out/search_efficiency_NAME.json
    local name=$1
    shift
    local file="$out/search_efficiency_$name.json"
    local start=$SECONDS
    "$python" benchmarks/search_efficiency/search_efficiency.py replay "$@" --out "$file" \
        >/dev/null
    echo "$file ($((SECONDS - start)) s): replay $*"
}

data=benchmarks/search_efficiency/data

if [ "$seeds" = --100-seeds ]; then
    amx="$data/table_gpt-tiny-amx.json"
    for rule in lower+simpler+steadier median+simpler+steadier; do
        suffix=${rule/#lower+simpler+steadier/}  # the tuner's rule: no suffix
        suffix=${suffix:+_$suffix}_100seeds
        flags=(--repeats 100 --confirmation-rule "$rule")
        replay "gpt-tiny-amx_unlimited$suffix" --table "$amx" "${flags[@]}"
        replay "gpt-tiny-amx_unlimited_noise0.075$suffix" --table "$amx" --noise 0.075 \
            "${flags[@]}"
        replay "gpt-tiny-amx_bimodal_$rule"_100seeds --table "$amx" --noise 0.075 --bimodal \
            "${flags[@]}"
        replay "dit-cpu_unlimited$suffix" --table "$data/table_dit-cpu.json" "${flags[@]}"
        replay "dit-cpu_unlimited_noise-measured$suffix" --table "$data/table_dit-cpu.json" \
            --noise measured "${flags[@]}"
        replay "gpt-tiny_unlimited$suffix" --table "$data/table_gpt-tiny.json" "${flags[@]}"
        replay "vision-script_unlimited_noise-measured$suffix" \
            --table "$data/table_vision-script.json" --noise measured "${flags[@]}"
    done
    exit 0
fi

if [ "$seeds" = --4-minutes ]; then
    flags=(--budget-s 240 --repeats 30)
    amx="$data/table_gpt-tiny-amx.json"
    replay gpt-tiny_unlimited_240s --table "$data/table_gpt-tiny.json" "${flags[@]}"
    replay gpt-tiny-amx_unlimited_240s --table "$amx" "${flags[@]}"
    replay gpt-tiny-amx_unlimited_noise0.075_240s --table "$amx" --noise 0.075 "${flags[@]}"
    replay gpt-tiny-amx_bimodal_240s --table "$amx" --noise 0.075 --bimodal "${flags[@]}"
    # the two that miss 27 of 30, over 100 seeds
    replay gpt-tiny-amx_unlimited_noise0.075_240s_100seeds --table "$amx" --noise 0.075 \
        --budget-s 240 --repeats 100
    replay gpt-tiny-amx_bimodal_240s_100seeds --table "$amx" --noise 0.075 --bimodal \
        --budget-s 240 --repeats 100
    replay gpt2-seq32_unlimited_240s --table "$data/table_gpt2-seq32.json" "${flags[@]}"
    replay gpt2-seq32-amx_unlimited_240s --table "$data/table_gpt2-seq32-amx.json" \
        "${flags[@]}"
    replay dit-cpu_unlimited_noise-measured_240s --table "$data/table_dit-cpu.json" \
        --noise measured "${flags[@]}"
    replay vision-script_unlimited_noise-measured_240s \
        --table "$data/table_vision-script.json" --noise measured "${flags[@]}"
    # the issue's case: probes of 10-30 s against 4 minutes
    flags+=(--probe-s 15)
    replay gpt-tiny-amx_unlimited_noise0.075_240s_probe15s --table "$amx" --noise 0.075 \
        "${flags[@]}"
    replay dit-cpu_unlimited_noise-measured_240s_probe15s --table "$data/table_dit-cpu.json" \
        --noise measured "${flags[@]}"
    replay vision-script_unlimited_noise-measured_240s_probe15s \
        --table "$data/table_vision-script.json" --noise measured "${flags[@]}"
    exit 0
fi

# AVX2 tables (2026-11-29)
replay gpt-tiny_unlimited --table "$data/table_gpt-tiny.json" --limit 64GiB --repeats 30
replay gpt-tiny_1.5GiB --table "$data/table_gpt-tiny.json" --limit 1.5GiB --repeats 30
replay gpt-tiny_48MiB --table "$data/table_gpt-tiny.json" --limit 48MiB --repeats 30
replay gpt2-seq32_unlimited --table "$data/table_gpt2-seq32.json" --limit 64GiB --repeats 30

# AMX table (2026-12-01): 3% noise, and the measured 7.5% without a limit
replay gpt-tiny-amx_unlimited --table "$data/table_gpt-tiny-amx.json" --limit 64GiB \
    --repeats 30
replay gpt-tiny-amx_unlimited_noise0.075 --table "$data/table_gpt-tiny-amx.json" \
    --limit 64GiB --repeats 30 --noise 0.075
replay gpt-tiny-amx_1.5GiB --table "$data/table_gpt-tiny-amx.json" --limit 1.5GiB --repeats 30
replay gpt-tiny-amx_48MiB --table "$data/table_gpt-tiny-amx.json" --limit 48MiB --repeats 30
replay gpt2-seq32-amx_unlimited --table "$data/table_gpt2-seq32-amx.json" --limit 64GiB \
    --repeats 30

# Bimodal offload probes (replay), 2026-12-01: the previous rule and the tuner's
replay gpt-tiny-amx_bimodal_mean --table "$data/table_gpt-tiny-amx.json" --repeats 30 \
    --noise 0.075 --bimodal --confirmation-rule mean
replay gpt-tiny-amx_bimodal_median+steadier --table "$data/table_gpt-tiny-amx.json" \
    --repeats 30 --noise 0.075 --bimodal --confirmation-rule median+steadier

# The simplicity order in the round (2026-12-04): the tuner's rule on the bimodal replay
replay gpt-tiny-amx_bimodal_median+simpler+steadier --table "$data/table_gpt-tiny-amx.json" \
    --repeats 30 --noise 0.075 --bimodal --confirmation-rule median+simpler+steadier

# The lower of median and mean (2026-12-06): the tuner's rule on the bimodal replay
replay gpt-tiny-amx_bimodal_lower+simpler+steadier --table "$data/table_gpt-tiny-amx.json" \
    --repeats 30 --noise 0.075 --bimodal --confirmation-rule lower+simpler+steadier

# DiT table (2026-12-04): two grid runs on this session's CPUs; 3% noise, the table's own
# pass-to-pass noise (--noise measured: 1.7%), and a limit that rules out ZeRO-1/2's buckets
replay dit-cpu_unlimited --table "$data/table_dit-cpu.json" --limit 64GiB --repeats 30
replay dit-cpu_unlimited_noise-measured --table "$data/table_dit-cpu.json" --limit 64GiB \
    --repeats 30 --noise measured
replay dit-cpu_512MiB --table "$data/table_dit-cpu.json" --limit 512MiB --repeats 30

# A script study's table (2026-12-04): examples/vision_deepspeed/train.py, unedited
replay vision-script_unlimited --table "$data/table_vision-script.json" --limit 64GiB \
    --repeats 30
replay vision-script_unlimited_noise-measured --table "$data/table_vision-script.json" \
    --limit 64GiB --repeats 30 --noise measured
