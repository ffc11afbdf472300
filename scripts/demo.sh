#!/usr/bin/env bash
# The main job on a machine without a GPU: builds the workspace, starts gpu-agent on the simulated
# default host (8 x H200, through the fake libnvidia-ml.so), applies examples/demo.toml with
# gpuctl, and shows the result. Pass --keep to leave the agent and its workers running afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."

keep=false
[[ "${1:-}" == "--keep" ]] && keep=true

cargo build --workspace --quiet
dir=$(mktemp -d /tmp/gpu-agent-demo.XXXXXX)
sock="$dir/agent.sock"
./target/debug/gpu-agent --simulate h200:8 --socket "$sock" --state-dir "$dir/state" >"$dir/agent.log" 2>&1 &
agent=$!
gpuctl() { ./target/debug/gpuctl --socket "$sock" "$@"; }

cleanup() {
    if ! $keep; then
        # An empty plan stops every worker; then the agent exits on SIGTERM.
        echo 'version = 1' >"$dir/empty.toml"
        gpuctl apply -f "$dir/empty.toml" >/dev/null 2>&1 || true
        kill "$agent" 2>/dev/null || true
        wait "$agent" 2>/dev/null || true
    fi
}
trap cleanup EXIT

for _ in $(seq 100); do
    gpuctl status >/dev/null 2>&1 && break
    kill -0 "$agent" 2>/dev/null || { cat "$dir/agent.log"; exit 1; }
    sleep 0.1
done

run() { echo; echo "\$ gpuctl $*"; gpuctl "$@"; }
run gpus
run apply -f examples/demo.toml
run status
run workers
run diff -f examples/demo.toml || true
echo
echo "worker output: $dir/state/logs/ (e.g. $(cat "$dir/state/logs/chat-small.0.log"))"
if $keep; then
    echo "agent pid $agent still runs on $sock; try: ./target/debug/gpuctl --socket $sock events"
fi
