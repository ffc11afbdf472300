#!/usr/bin/env bash
# Worker supervision figures on the simulated host (no GPU needed), through gpuctl:
#  - crash-to-restart latency with zero backoff (restart_backoff = "0s"): kill -9 a worker
#    (restart = "always") and time until the agent has started its replacement (the agent's own
#    event timestamp, in ms, against the time of the kill); rounds of 9 kills (a 10th quick exit in
#    a row would end the crash loop in `failed`), each round after a `gpuctl restart`;
#  - the agent's resident memory and CPU while it supervises 100 idle workers.
# Usage: bash scripts/bench-workers.sh [KILLS] [IDLE_SECONDS]   (release build)
set -euo pipefail
cd "$(dirname "$0")/.."
kills=${1:-30}
idle=${2:-30}
cargo build --release --quiet --bin gpu-agent --bin gpuctl
cargo build --release --quiet -p testworker
dir=$(mktemp -d /tmp/gpu-agent-bench.XXXXXX)
sock=$dir/a.sock
printf 'restart_backoff = "0s"\n' >"$dir/agent.toml"
./target/release/gpu-agent --simulate h200:1 --config "$dir/agent.toml" --socket "$sock" --state-dir "$dir/state" >"$dir/agent.log" 2>&1 &
agent=$!
ctl() { ./target/release/gpuctl --socket "$sock" "$@"; }
cleanup() {
    printf 'version = 1\n' >"$dir/empty.toml"
    ctl apply -f "$dir/empty.toml" >/dev/null 2>&1 || true
    kill "$agent" 2>/dev/null || true
    wait "$agent" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 100); do ctl status >/dev/null 2>&1 && break; sleep 0.1; done

# 1. crash-to-restart
printf 'version = 1\n[[gpus]]\nselect = "0"\nsharing = "time-slicing"\n[[models]]\nname = "crash"\ncommand = ["%s"]\nmemory = "1GiB"\nrestart = "always"\n' \
    "$PWD/target/release/testworker" >"$dir/one.toml"
ctl apply -f "$dir/one.toml" >/dev/null
lat=()
for k in $(seq "$kills"); do
    if ((k % 9 == 1 && k > 1)); then ctl restart crash >/dev/null; fi
    pid=$(ctl -o json workers | python3 -c 'import json,sys; print(json.load(sys.stdin)["workers"][0]["pid"])')
    t0=$(date +%s%3N)
    kill -9 "$pid"
    for _ in $(seq 200); do
        new=$(ctl -o json workers | python3 -c 'import json,sys; w=json.load(sys.stdin)["workers"][0]; print(w["pid"] or 0)')
        [[ $new != 0 && $new != "$pid" ]] && break
        sleep 0.005
    done
    # The agent's own timestamp of the replacement's start.
    t1=$(ctl -o json events | python3 -c "
import json,sys
ev=[e for e in json.load(sys.stdin)['events'] if e['kind']=='worker_started' and 'pid $new)' in e['message']]
print(ev[-1]['at_unix_ms'])")
    lat+=($((t1 - t0)))
    sleep 0.2
done
stats() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {printf "median %d ms, p90 %d ms, max %d ms (n=%d)", a[int((NR+1)/2)], a[int(NR*0.9+0.5)], a[NR], NR}'; }

# 2. 100 idle workers
printf 'version = 1\n[[gpus]]\nselect = "0"\nsharing = "time-slicing"\n[[models]]\nname = "idle"\ncommand = ["/usr/bin/sleep", "infinity"]\nmemory = "1GiB"\nreplicas = 100\n' >"$dir/hundred.toml"
ctl apply -f "$dir/hundred.toml" >/dev/null
running=$(ctl -o json workers | python3 -c 'import json,sys; print(sum(w["state"]=="running" for w in json.load(sys.stdin)["workers"]))')
sleep 2
ticks=$(getconf CLK_TCK)
cpu0=$(awk '{print $14+$15}' "/proc/$agent/stat")
sleep "$idle"
cpu1=$(awk '{print $14+$15}' "/proc/$agent/stat")
rss=$(awk '/VmRSS/ {print $2}' "/proc/$agent/status")
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$agent/status")
cpu_pct=$(python3 -c "print(f'{100*($cpu1-$cpu0)/$ticks/$idle:.2f}')")

cat <<REPORT
Worker supervision on the simulated host ($(nproc) CPUs, release build)
- crash-to-restart (kill -9 of a worker with restart = "always" until the agent started the next one): $(stats "${lat[@]}")
- supervising $running idle workers for ${idle}s: resident memory $((rss / 1024)) MiB ($rss KiB; peak $((hwm / 1024)) MiB), CPU ${cpu_pct}% of one core
REPORT
