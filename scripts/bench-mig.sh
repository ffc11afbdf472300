#!/usr/bin/env bash
# MIG on the simulated driver: how long applying a full 8 x H200 layout takes through gpuctl, and
# how many instances a one-instance change destroys. Prints a report; nothing needs a GPU.
# Usage: bash scripts/bench-mig.sh [ROUNDS]   (release build)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
cargo build --release --quiet --bin gpu-agent --bin gpuctl
dir=$(mktemp -d /tmp/gpu-agent-bench.XXXXXX)
sock=$dir/a.sock
./target/release/gpu-agent --simulate h200:8 --socket "$sock" --state-dir "$dir/state" >"$dir/agent.log" 2>&1 &
agent=$!
trap 'kill $agent 2>/dev/null; wait $agent 2>/dev/null; rm -rf "$dir"' EXIT
ctl() { ./target/release/gpuctl --socket "$sock" "$@"; }
for _ in $(seq 100); do ctl status >/dev/null 2>&1 && break; sleep 0.1; done

full="$dir/full.toml"; off="$dir/off.toml"
printf 'version = 1\n[[gpus]]\nselect = "all"\nsharing = "mig"\nmig = ["1g.18gb", "1g.18gb", "1g.18gb", "1g.18gb", "1g.18gb", "1g.18gb", "1g.18gb"]\n' >"$full"
printf 'version = 1\n[[gpus]]\nselect = "all"\nsharing = "time-slicing"\n' >"$off"

ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
apply_times=(); clear_times=()
for _ in $(seq "$rounds"); do
    t=$(date +%s%N); ctl apply -f "$full" >/dev/null; apply_times+=("$(ms "$t")")
    t=$(date +%s%N); ctl apply -f "$off" >/dev/null; clear_times+=("$(ms "$t")")
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

ctl apply -f "$full" >/dev/null
steps=$(ctl -o json apply -f "$full" --dry-run | grep -c '"action"' || true)
one="$dir/one.toml"
printf 'version = 1\n[[gpus]]\nselect = "all"\nsharing = "mig"\nmig = ["1g.18gb", "1g.18gb", "1g.18gb", "1g.18gb", "1g.18gb", "1g.18gb", "1g.18gb+me"]\n' >"$one"
diff_json=$(ctl -o json diff -f "$one" || true)
destroys=$(grep -c '"destroy_gpu_instance"' <<<"$diff_json" || true)
creates=$(grep -c '"create_gpu_instance"' <<<"$diff_json" || true)

cat <<REPORT
MIG on the simulated driver ($(nproc) CPUs, release build, $rounds rounds)
- apply of a full layout on 8 x H200 (enable MIG + 56 GPU instances with compute instances):
  median $(median "${apply_times[@]}") ms (all: ${apply_times[*]})
- apply back to MIG off (56 destroys + 8 mode changes): median $(median "${clear_times[@]}") ms (all: ${clear_times[*]})
- re-applying the same full layout: $steps step(s)
- one instance changed per GPU (1g.18gb -> 1g.18gb+me) on 8 GPUs holding 7 each: $destroys destroy(s), $creates create(s), i.e. $((destroys / 8)) destroy per GPU
REPORT
