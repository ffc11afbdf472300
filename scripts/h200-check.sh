#!/usr/bin/env bash
# Run on a real GPU host (the lent H200): the agent against the real driver with --read-only-gpus,
# compared with nvidia-smi. Changes no GPU setting. Expects prebuilt binaries in $BIN (default
# .device/bin) and writes everything to $OUT (default ./h200-out).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.device/bin}
OUT=${OUT:-./h200-out}
mkdir -p "$OUT"
dir=$(mktemp -d)
"$BIN/gpu-agent" --read-only-gpus --socket "$dir/a.sock" --state-dir "$dir/state" >"$OUT/agent.log" 2>&1 &
agent=$!
ctl() { "$BIN/gpuctl" --socket "$dir/a.sock" "$@"; }
for _ in $(seq 100); do ctl status >/dev/null 2>&1 && break; sleep 0.1; done
ctl -o json gpus >"$OUT/gpus.json"
ctl -o json profiles 0 >"$OUT/profiles0.json"
{ ctl gpus; echo; ctl profiles 0; echo; ctl status; } >"$OUT/gpuctl.txt" 2>&1
nvidia-smi --query-gpu=index,name,uuid,pci.device_id,pci.bus_id,memory.total,memory.used,mig.mode.current,mig.mode.pending,compute_mode \
    --format=csv,noheader,nounits >"$OUT/query.csv"
nvidia-smi mig -lgip >"$OUT/lgip.txt" 2>&1
nvidia-smi mig -lgipp >"$OUT/lgipp.txt" 2>&1
python3 scripts/compare_gpus.py "$OUT" | tee "$OUT/compare.txt"
rc=${PIPESTATUS[0]}

# A real CUDA worker through the agent (time-slicing tier, no GPU setting changed): its GPU memory
# must show up in `gpuctl workers` and in `gpus` as one of its processes.
py=$(command -v python3)
cat >"$dir/plan.toml" <<PLAN
version = 1
[[gpus]]
select = "0"
sharing = "time-slicing"
[[models]]
name = "cuda-probe"
command = ["$py", "-c", "import torch,time; x=torch.empty(2<<30, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize(); print('allocated', flush=True); time.sleep(60)"]
memory = "4GiB"
user = "root"
PLAN
echo 'allow_root_workers = true' >"$dir/agent.toml"
kill "$agent"; wait "$agent"
"$BIN/gpu-agent" --config "$dir/agent.toml" --read-only-gpus --socket "$dir/a.sock" --state-dir "$dir/state" >>"$OUT/agent.log" 2>&1 &
agent=$!
for _ in $(seq 100); do ctl status >/dev/null 2>&1 && break; sleep 0.1; done
{
    echo "\$ gpuctl apply -f plan.toml"; ctl apply -f "$dir/plan.toml"
    for _ in $(seq 60); do grep -q allocated "$dir/state/logs/cuda-probe.0.log" 2>/dev/null && break; sleep 0.5; done
    sleep 1
    echo "\$ gpuctl workers"; ctl workers
    echo "\$ gpuctl -o json workers"; ctl -o json workers
    echo "\$ gpuctl -o json gpus (processes)"; ctl -o json gpus | python3 -c "import json,sys; print(json.load(sys.stdin)['gpus'][0]['processes'])"
    echo "\$ nvidia-smi --query-compute-apps=pid,used_memory --format=csv"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv
    echo 'version = 1' >"$dir/empty.toml"; echo "\$ gpuctl apply -f empty.toml"; ctl apply -f "$dir/empty.toml"
} >"$OUT/worker.txt" 2>&1
cat "$OUT/worker.txt"
kill "$agent"; wait "$agent"
exit "$rc"
