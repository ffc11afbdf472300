#!/usr/bin/env bash
# The MPS tier of gpu-agent on a real GPU (the lent H200), end to end, in two phases:
#   a. validation: 8 MPS clients through the agent (nvidia-smi M+C, gpuctl attribution), a memory
#      hog that must hit its MPS pinned-memory limit without hurting the others, and kill -9 of the
#      MPS control daemon with the agent's recovery timed;
#   b. benchmark: N = 1 2 4 8 small models under mps and time-slicing, and a light victim next to a
#      heavy aggressor (uncapped, capped at compute = 25, time-slicing).
# Everything lands in $OUT: validation.txt, bench.json, bench.md, run.log, logs.tar.gz.
#
#   OUT=$OUT bash bench/h200_mps.sh        # from the repo root; BIN=.device/bin by default
#   bash bench/h200_mps.sh --dry           # print the plans and the schedule; needs no GPU
#
# Changes no GPU setting: the agent runs with --read-only-gpus; MPS daemons get their own pipe
# directories under a fresh runtime dir. Settings (environment): BIN, OUT, PY (python with torch
# and transformers), DUR (seconds per measurement, 8), BUDGET (seconds for the phases, 510; cleanup after),
# ONLY (all | validation | bench), START_MODE (file: start when all are READY | at: fixed margin),
# SIMULATE=h200:1 with FAKE=1 (orchestration test without a GPU: simulated driver, fake workers).
# shellcheck disable=SC2317 # finish and the plan functions are called through the trap and by name
set -uo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.." || exit 2
REPO=$(pwd -P)

DRY=0
case "${1:-}" in
--dry) DRY=1 ;;
"") ;;
*) echo "usage: bash bench/h200_mps.sh [--dry]" >&2; exit 2 ;;
esac

BIN=${BIN:-.device/bin}
OUT=${OUT:-./h200-mps-out}
PY=${PY:-$(command -v python3 || echo /opt/torch/.venv/bin/python3)}
DUR=${DUR:-8}
BUDGET=${BUDGET:-510}
ONLY=${ONLY:-all}
START_MODE=${START_MODE:-file}
SIMULATE=${SIMULATE:-}
FAKE=${FAKE:-0}
RESERVE=${RESERVE:-35}       # seconds kept for the final cleanup, summary and tar
START_DELAY=${START_DELAY:-1.5}
LOAD_EST=${LOAD_EST:-40}     # seconds from apply to all READY; replaced by what validation measures
WORKER=$REPO/bench/model_worker.py
T0=$(date +%s)

[[ -d $BIN ]] && BIN=$(cd "$BIN" && pwd -P)
((DRY)) || { mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd -P); }
if ((DRY)); then
    W=/tmp/gab.DRY
else
    W=$(mktemp -d /tmp/gab.XXXXXX)
fi
STATE=$W/state
RUNTIME=$W/run
SOCK=$W/agent.sock
RUNS=$W/runs
V=$W/validation
VTXT=$OUT/validation.txt
AGENT_PID=
EMPTY=$W/empty.toml

# ---------------------------------------------------------------------------------------------
# helpers

log() {
    local line
    line="[+$(($(date +%s) - T0))s] $*"
    echo "$line"
    ((DRY)) || echo "$line" >>"$W/run.log"
}
left() { echo $((T0 + BUDGET - $(date +%s))); }
tmo() { # WANTED-SECONDS: that, or less when the budget (less the reserve) is shorter; at least 5
    local t=$1 l
    l=$(($(left) - RESERVE))
    ((l < t)) && t=$l
    ((t < 5)) && t=5
    echo "$t"
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
ctl() { "$BIN/gpuctl" --socket "$SOCK" "$@"; }
poll() { "$PY" "$REPO/bench/poll.py" --bin "$BIN" --sock "$SOCK" --state "$STATE" --pids-log "$W/pids.txt" "$@"; }
vline() { # PASS|FAIL|INFO text
    local line="$1 $2"
    echo "$line" >>"$VTXT"
    log "validation: $line"
}
verdict() { if [[ $1 == 0 ]]; then echo PASS; else echo FAIL; fi; }
jget() { # FILE PYTHON-EXPR-ON-d: print one value from a JSON file
    "$PY" -c 'import json,sys
try: d = json.load(open(sys.argv[1]))
except Exception: d = {}
try: v = eval(sys.argv[2])
except Exception: v = None
print("" if v is None else v)' "$1" "$2"
}

# The worker environment: nothing may be downloaded; caches in /tmp.
ENV_TOML='env = { HF_HOME = "/tmp/gab-hf", HF_HUB_OFFLINE = "1", TRANSFORMERS_OFFLINE = "1", PYTHONUNBUFFERED = "1", PYTHONDONTWRITEBYTECODE = "1", OMP_NUM_THREADS = "2", TOKENIZERS_PARALLELISM = "false", TRANSFORMERS_VERBOSITY = "error" }'

plan_gpu() { # SHARING
    printf 'version = 1\n\n[[gpus]]\nselect = "0"\nsharing = "%s"\n' "$1"
}

plan_model() { # NAME REPLICAS ISOLATION MEMORY COMPUTE(or "") WORKER-ARGS...
    local name=$1 replicas=$2 iso=$3 mem=$4 compute=$5 cmd a
    shift 5
    cmd="\"$PY\", \"$WORKER\""
    for a in "$@"; do cmd+=", \"$a\""; done
    ((FAKE)) && cmd+=', "--fake"'
    printf '\n[[models]]\nname = "%s"\ncommand = [%s]\nisolation = "%s"\nmemory = "%s"\nreplicas = %s\nuser = "root"\nstop_timeout = "20s"\n%s\n' \
        "$name" "$cmd" "$iso" "$mem" "$replicas" "$ENV_TOML"
    [[ -n $compute ]] && printf 'compute = %s\n' "$compute"
    return 0
}

# Small model of the scaling runs and the victim: 6 x 768, batch 1 x 32 tokens (the defaults).
SMALL=(--layers 6 --hidden 768 --batch 1 --tokens 32)
HEAVY=(--layers 24 --hidden 2048 --batch 16 --tokens 512 --warmup 5)

apply() { # PLAN JSON-OUT
    timeout 180 "$BIN/gpuctl" --socket "$SOCK" -o json apply -f "$1" >"$2" 2>&1
}

empty_plan() { # wait for every worker (and MPS daemon) to be gone
    local tag=$1 rc
    apply "$EMPTY" "$W/empty-$tag.json"
    rc=$?
    poll --out "$W/gone-$tag.json" wait-gone --timeout 60 >>"$W/run.log" 2>&1
    return $((rc || $?))
}

# ---------------------------------------------------------------------------------------------
# cleanup: empty plan, SIGTERM the agent, then the last resorts; then the reports and the tar.

agent_alive() { [[ -n $AGENT_PID ]] && kill -0 "$AGENT_PID" 2>/dev/null; }

finish() {
    local rc=$? p pid pids
    trap - EXIT INT TERM
    ((DRY)) && exit "$rc"
    log "cleanup (exit status so far $rc)"
    if agent_alive; then
        apply "$EMPTY" "$W/empty-final.json" || log "final empty plan: apply failed (see empty-final.json)"
        poll --out "$W/gone-final.json" wait-gone --timeout 40 >>"$W/run.log" 2>&1 || log "final wait-gone failed"
        ctl events >"$W/events.txt" 2>&1
        ctl -o json status >"$W/status-final.json" 2>&1
        kill -TERM "$AGENT_PID" 2>/dev/null
        for _ in $(seq 150); do agent_alive || break; sleep 0.1; done
        if agent_alive; then
            log "agent did not stop on SIGTERM; SIGKILL"
            kill -KILL "$AGENT_PID" 2>/dev/null
        fi
        wait "$AGENT_PID" 2>/dev/null
    fi
    # Last resort 1: workers the agent left behind (only our own, by pid, checked by command line).
    pids=()
    if [[ -f $W/pids.txt ]]; then
        while read -r pid; do
            grep -qs model_worker.py "/proc/$pid/cmdline" && pids+=("$pid")
        done < <(sort -un "$W/pids.txt")
    fi
    if ((${#pids[@]})); then
        log "last resort: SIGTERM to leftover workers ${pids[*]}"
        kill -TERM "${pids[@]}" 2>/dev/null
        sleep 3
        for pid in "${pids[@]}"; do grep -qs model_worker.py "/proc/$pid/cmdline" && kill -KILL "$pid" 2>/dev/null; done
    fi
    # Last resort 2: an MPS control daemon still running on one of our pipe directories.
    for p in "$RUNTIME"/mps/*/pipe; do
        [[ -d $p ]] || continue
        pid=$(cat "$p/nvidia-cuda-mps-control.pid" 2>/dev/null)
        if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
            log "last resort: quit to the MPS daemon $pid on $p"
            echo quit | CUDA_MPS_PIPE_DIRECTORY=$p CUDA_MPS_LOG_DIRECTORY=${p%/pipe}/log timeout 10 nvidia-cuda-mps-control >>"$W/run.log" 2>&1
        fi
    done
    command -v nvidia-smi >/dev/null && nvidia-smi >"$W/nvidia-smi-final.txt" 2>&1
    summarize
    wait 2>/dev/null # the background preflight, if still running
    cp "$W/run.log" "$OUT/run.log" 2>/dev/null
    tar -czf "$OUT/logs.tar.gz" -C "$W" --exclude='./run/mps/*/pipe' --exclude=./agent.sock . 2>>"$OUT/run.log" ||
        echo "tar failed" >>"$OUT/run.log"
    log "done in $(($(date +%s) - T0))s; outputs: $(cd "$OUT" && echo ./*)"
    cp "$W/run.log" "$OUT/run.log" 2>/dev/null
    exit "$rc"
}

summarize() {
    [[ -d $RUNS ]] || mkdir -p "$RUNS"
    printf '{"date": "%s", "duration_s": %s, "start_mode": "%s", "budget_s": %s, "load_est_s": %s, "simulate": "%s", "fake": %s, "wall_s": %s}\n' \
        "$(date -u +%FT%TZ)" "$DUR" "$START_MODE" "$BUDGET" "$LOAD_EST" "$SIMULATE" "$FAKE" "$(($(date +%s) - T0))" >"$W/meta.json"
    "$PY" "$REPO/bench/summarize.py" --runs "$RUNS" --out "$OUT" --duration "$DUR" --meta "$W/meta.json" \
        --validation "$VTXT" --recovery "$V/recover.json" 2>&1 | tee -a "$W/run.log"
}

# ---------------------------------------------------------------------------------------------
# a. validation

validation() {
    local plan1=$V/plan-8.toml plan2=$V/plan-8-hog.toml t rc l8 pid n r line mc m oom expect
    mkdir -p "$V"
    { plan_gpu mps; plan_model bench 8 mps 3GiB "" "${SMALL[@]}" --duration 0 --idle-interval 0.05; } >"$plan1"
    { cat "$plan1"; plan_model hog 1 mps 1GiB "" --layers 1 --hidden 128 --duration 0 --alloc-mib 2048 --idle-interval 0.05; } >"$plan2"
    ((DRY)) && { echo "### validation plan (8 MPS clients)"; cat "$plan1"; echo "### + hog"; sed -n '/name = "hog"/,$p' "$plan2"; return 0; }
    : >"$VTXT"

    log "validation: apply 8 MPS replicas"
    poll --out "$V/offsets-1.json" offsets >/dev/null
    t=$(now)
    apply "$plan1" "$V/apply-8.json"
    rc=$?
    vline "$(verdict $rc)" "apply of a plan with sharing = \"mps\" and 8 mps replicas (gpuctl exit $rc)"
    poll --out "$V/ready-8.json" wait-ready --expect bench:8 --offsets "$V/offsets-1.json" --timeout "$(tmo 240)" | tee -a "$W/run.log"
    rc=${PIPESTATUS[0]}
    l8=$(since "$t")
    vline "$(verdict "$rc")" "all 8 workers running and READY ${l8}s after apply"
    LOAD_EST=$(awk -v l="$l8" 'BEGIN { v = int(l + 0.999) + 8; if (v < 15) v = 15; print v }')
    log "load estimate for benchmark runs: ${LOAD_EST}s"

    # Snapshots while the 8 run.
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi >"$V/nvidia-smi.txt" 2>&1
        nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv >"$V/compute-apps.csv" 2>&1
    else
        echo "nvidia-smi not found" >"$V/nvidia-smi.txt"
    fi
    ctl -o json gpus >"$V/gpus.json" 2>&1
    ctl -o json workers >"$V/workers.json" 2>&1
    ctl -o json status >"$V/status.json" 2>&1
    { ctl status; echo; ctl workers; echo; ctl gpus; } >"$V/gpuctl.txt" 2>&1
    poll --out "$V/clients.json" clients --expect bench:8 --timeout 10 | tee -a "$W/run.log"
    rc=${PIPESTATUS[0]}
    vline "$(verdict "$rc")" "gpuctl gpus: $(jget "$V/clients.json" 'sum(x["ok"] for x in d["workers"])')/8 worker pids are MPS clients (mps_client true) attributed to bench/0-7"
    n=$(jget "$V/clients.json" 'sum(1 for x in d["workers"] if x.get("nvml_mps_process"))')
    [[ -n $n ]] && vline "$( ((n == 8)) && echo PASS || echo FAIL)" "NVML (pynvml) lists $n of the 8 worker pids as MPS compute processes"
    mc=$(grep -c 'M+C' "$V/nvidia-smi.txt")
    vline "$( ((mc >= 8)) && echo PASS || echo FAIL)" "nvidia-smi process table: $mc processes of type M+C (want >= 8)"
    n=0
    for r in $(seq 0 7); do
        line=$(grep '^MPS=' "$STATE/logs/bench.$r.log" 2>/dev/null | tail -1)
        [[ $line == MPS=/* ]] && n=$((n + 1))
    done
    vline "$( ((n == 8)) && echo PASS || echo FAIL)" "$n/8 workers saw CUDA_MPS_PIPE_DIRECTORY (e.g. $(grep -h '^MPS=' "$STATE/logs/bench.0.log" 2>/dev/null | tail -1))"
    m=$(jget "$V/workers.json" '", ".join(str(w["replica"]) + ":" + str(w.get("gpu_memory_used_mib")) for w in d["workers"])')
    vline INFO "GPU memory per worker (replica:MiB) from gpuctl workers: $m (budget 3072 MiB each)"
    pid=$(jget "$V/status.json" 'd["mps_daemons"][0]["pid"]')
    vline "$([[ -n $pid ]] && echo PASS || echo FAIL)" "gpuctl status lists the MPS daemon $(jget "$V/status.json" 'd["mps_daemons"][0]["name"]') (pid $pid, state $(jget "$V/status.json" 'd["mps_daemons"][0]["state"]'))"

    # A hog with a 1 GiB budget asks for 2 GiB: MPS must refuse it; the others carry on.
    log "validation: add the hog"
    poll --out "$V/offsets-2.json" offsets >/dev/null
    apply "$plan2" "$V/apply-hog.json"
    rc=$?
    [[ $rc == 0 ]] || vline FAIL "apply with the hog added (gpuctl exit $rc)"
    poll --out "$V/ready-hog.json" wait-ready --expect hog:1 --offsets "$V/offsets-2.json" --timeout "$(tmo 120)" | tee -a "$W/run.log"
    oom=$(grep -h -E '^(OOM:|ALLOC OK|ALLOC FAILED)' "$STATE/logs/hog.0.log" 2>/dev/null | tail -1)
    vline "$([[ $oom == OOM:* ]] && echo PASS || echo FAIL)" "hog (memory = 1GiB, --alloc-mib 2048) got an out-of-memory error: ${oom:-nothing in its log}"
    ctl -o json workers >"$V/workers-hog.json" 2>&1
    poll --out "$V/same-pids.json" same-pids --expect bench:8 --before "$V/workers.json" | tee -a "$W/run.log"
    rc=${PIPESTATUS[0]}
    vline "$(verdict "$rc")" "the 8 bench workers kept running with unchanged pids while the hog hit its limit"
    vline INFO "hog GPU memory from gpuctl workers: $(jget "$V/workers-hog.json" '[w.get("gpu_memory_used_mib") for w in d["workers"] if w["model"] == "hog"][0]') MiB (budget 1024)"

    # kill -9 the control daemon; time the recovery.
    log "validation: kill -9 the MPS control daemon"
    expect=bench:8
    [[ $(jget "$V/ready-hog.json" 'd["ok"]') == True ]] && expect=bench:8,hog:1
    n=$(count_expect "$expect")
    poll --out "$V/recover.json" recover --expect "$expect" --timeout "$(tmo 150)" | tee -a "$W/run.log"
    rc=${PIPESTATUS[0]}
    vline "$(verdict "$rc")" "recovery after kill -9 of the MPS control daemon (pid $(jget "$V/recover.json" 'd["old_daemon_pid"]') -> $(jget "$V/recover.json" 'd["new_daemon_pid"]'), restarts $(jget "$V/recover.json" 'd["daemon_restarts"]'))"
    vline INFO "recovery, agent's own figure (event mps_recovered): $(jget "$V/recover.json" 'd["agent_event_ms"]') ms after it went down, $(jget "$V/recover.json" 'd["agent_event_workers"]') worker(s) started again; event times after the kill: mps_down $(jget "$V/recover.json" 'd["event_times"]["mps_down_after_kill_ms"]') ms, mps_recovered $(jget "$V/recover.json" 'd["event_times"]["mps_recovered_after_kill_ms"]') ms"
    vline INFO "recovery, wall clock from the kill (100 ms polls of gpuctl): agent shows it down $(jget "$V/recover.json" 'd["wall_ms"].get("agent_saw_down")') ms; daemon running again $(jget "$V/recover.json" 'd["wall_ms"].get("daemon_back")') ms; all $n workers running with new pids $(jget "$V/recover.json" 'd["wall_ms"].get("workers_restarted")') ms; all READY again $(jget "$V/recover.json" 'd["wall_ms"].get("all_ready")') ms"
    poll --out "$V/clients-after.json" clients --expect "$expect" --timeout 10 | tee -a "$W/run.log"
    rc=${PIPESTATUS[0]}
    vline "$(verdict "$rc")" "after recovery: $(jget "$V/clients-after.json" 'sum(x["ok"] for x in d["workers"])')/$n workers are MPS clients of the new daemon (none runs without MPS)"
    ctl events >"$V/events.txt" 2>&1
    n=$(grep -c mps_not_client "$V/events.txt")
    vline "$( ((n == 0)) && echo PASS || echo FAIL)" "no mps_not_client event ($n)"
    { nvidia-smi >"$V/nvidia-smi-after-recovery.txt" 2>&1; } 2>/dev/null

    log "validation: empty plan"
    t=$(now)
    empty_plan validation
    rc=$?
    vline "$(verdict "$rc")" "empty plan: all workers and the MPS daemon gone after $(since "$t")s ($(jget "$W/gone-validation.json" 'd["elapsed_s"]')s of waiting)"
}

# ---------------------------------------------------------------------------------------------
# b. benchmark runs

SEQ=0
expect_json() { # "a:1,b:2" -> {"a": 1, "b": 2}
    local out="" part
    IFS=, read -ra parts <<<"$1"
    for part in "${parts[@]}"; do out+="${out:+, }\"${part%%:*}\": ${part##*:}"; done
    echo "{$out}"
}
count_expect() { # "a:1,b:2" -> 3
    local n=0 part
    IFS=, read -ra parts <<<"$1"
    for part in "${parts[@]}"; do n=$((n + ${part##*:})); done
    echo "$n"
}

# run_one ID KIND TIER N LABEL EXPECT ROLES-JSON PLAN-FUNCTION
run_one() {
    local id=$1 kind=$2 tier=$3 n=$4 label=$5 expect=$6 roles=$7 planfn=$8
    local rd=$RUNS/$id status=ok note="" load=null t start need got rc limit
    mkdir -p "$rd/results"
    write_meta() {
        printf '{"id": "%s", "kind": "%s", "tier": "%s", "n": %s, "label": "%s", "expect": %s, "roles": %s, "status": "%s", "note": "%s", "load_s": %s, "duration_s": %s, "start_mode": "%s"}\n' \
            "$id" "$kind" "$tier" "$n" "$label" "$(expect_json "$expect")" "$roles" "$status" "${note//\"/\'}" "$load" "$DUR" "$START_MODE" >"$rd/run.json"
    }
    if [[ $START_MODE == at ]]; then
        START_ARGS=(--start-at "$(awk -v n="$(now)" -v m="$((LOAD_EST + 10))" 'BEGIN { printf "%.3f", n + m }')")
    else
        START_ARGS=(--start-file "$rd/start")
    fi
    "$planfn" "$rd" >"$rd/plan.toml"
    if ((DRY)); then
        echo "### $id ($kind, $tier, N=$n${label:+, $label})"
        cat "$rd/plan.toml"
        return 0
    fi
    need=$((LOAD_EST + ${DUR%.*} + 15))
    if (($(left) < need + RESERVE)); then
        status=skipped note="skipped: $(left)s left of the budget, this run needs about ${need}s"
        write_meta
        log "$id: $note"
        return 0
    fi
    log "$id: apply"
    poll --out "$rd/offsets.json" offsets >/dev/null
    t=$(now)
    if ! apply "$rd/plan.toml" "$rd/apply.json"; then
        status=failed note="apply failed: $(head -c 300 "$rd/apply.json" | tr '\n"' " '")"
        write_meta
        log "$id: $note"
        empty_plan "$id"
        return 1
    fi
    poll --out "$rd/ready.json" wait-ready --expect "$expect" --offsets "$rd/offsets.json" \
        --timeout $(($(left) - RESERVE - ${DUR%.*} - 10)) | tee -a "$W/run.log"
    rc=${PIPESTATUS[0]}
    load=$(since "$t")
    if [[ $rc != 0 ]]; then
        status=failed note="workers not READY: $(jget "$rd/ready.json" '"; ".join(d["problems"])')"
        write_meta
        log "$id: $note"
        empty_plan "$id"
        return 1
    fi
    if [[ $START_MODE != at ]]; then
        start=$(awk -v n="$(now)" -v d="$START_DELAY" 'BEGIN { printf "%.3f", n + d }')
        echo "$start" >"$rd/start.tmp" && mv "$rd/start.tmp" "$rd/start"
    fi
    need=$(count_expect "$expect")
    log "$id: all $need READY after ${load}s; measuring ${DUR}s"
    t=$(now)
    limit=$((${DUR%.*} + 45))
    [[ $START_MODE == at ]] && limit=$((limit + LOAD_EST + 10))
    while :; do
        got=$(find "$rd/results" -name '*.json' | wc -l)
        ((got >= need)) && break
        [[ $(awk -v s="$(since "$t")" -v l="$limit" 'BEGIN { print (s > l) }') == 1 ]] && break
        sleep 0.25
    done
    if ((got < need)); then
        status=failed note="$got of $need result files"
    fi
    write_meta
    log "$id: $got/$need results; $(jget "$rd/ready.json" 'd["elapsed_s"]')s to READY"
    empty_plan "$id" || log "$id: empty plan or wait-gone failed (see gone-$id.json)"
    return 0
}

plan_scale() { # RD  (uses TIER N)
    plan_gpu "$TIER"
    plan_model bench "$N" "$TIER" 4GiB "" "${SMALL[@]}" --duration "$DUR" "${START_ARGS[@]}" --out "$1/results"
}
plan_inter() { # RD  (uses TIER CAP)
    plan_gpu "$TIER"
    plan_model victim 1 "$TIER" 4GiB "" "${SMALL[@]}" --duration "$DUR" "${START_ARGS[@]}" --out "$1/results"
    plan_model aggressor 1 "$TIER" 16GiB "$CAP" "${HEAVY[@]}" --duration "$DUR" "${START_ARGS[@]}" --out "$1/results"
}

scale() { # TIER N
    TIER=$1 N=$2
    SEQ=$((SEQ + 1))
    run_one "$(printf '%02d' "$SEQ")-$1-$2" scale "$1" "$2" "" "bench:$2" '{"bench": "bench"}' plan_scale
}
inter() { # LABEL TIER CAP
    TIER=$2 CAP=$3
    SEQ=$((SEQ + 1))
    run_one "$(printf '%02d' "$SEQ")-inter-$1" interference "$2" 2 "$1" "victim:1,aggressor:1" \
        '{"victim": "victim", "aggressor": "aggressor"}' plan_inter
}

benchmark() {
    mkdir -p "$RUNS"
    # Most important first, so a short budget still answers the targets.
    scale mps 1
    scale time-slicing 1
    scale mps 8
    scale time-slicing 8
    inter mps-capped-25 mps 25
    inter mps-uncapped mps ""
    inter time-slicing time-slicing ""
    scale mps 2
    scale mps 4
    scale time-slicing 2
    scale time-slicing 4
}

# ---------------------------------------------------------------------------------------------
# main

if ((DRY)); then
    echo "# dry run: BIN=$BIN OUT=$OUT PY=$PY DUR=$DUR BUDGET=$BUDGET ONLY=$ONLY START_MODE=$START_MODE"
    echo "# agent: $BIN/gpu-agent --read-only-gpus --config $W/agent.toml --socket $SOCK --state-dir $STATE --runtime-dir $RUNTIME${SIMULATE:+ --simulate $SIMULATE}"
    echo "# schedule (estimates): validation ~90-120 s (8 loads in parallel, hog, kill -9 + reload, empty plan);"
    echo "#   11 benchmark runs of ~(load ${LOAD_EST}s until measured + ${START_DELAY}s + ${DUR}s + ~5s stop) each, most important first;"
    echo "#   a run is skipped when less than its estimate + ${RESERVE}s is left of ${BUDGET}s"
    mkdir -p "$W"
    [[ $ONLY != bench ]] && validation
    [[ $ONLY != validation ]] && benchmark
    rm -rf "$W"
    exit 0
fi

trap finish EXIT
trap 'log "interrupted"; exit 130' INT TERM
mkdir -p "$STATE" "$RUNTIME" "$RUNS" "$V"
: >"$W/run.log"
echo 'version = 1' >"$EMPTY"
log "work dir $W; BIN=$BIN PY=$PY DUR=$DUR BUDGET=$BUDGET ONLY=$ONLY START_MODE=$START_MODE${SIMULATE:+ SIMULATE=$SIMULATE FAKE=$FAKE}"

# Preflight (the Python part in the background: it also warms the page cache for the workers).
if [[ ! -x $BIN/gpu-agent || ! -x $BIN/gpuctl ]]; then
    log "FATAL: $BIN/gpu-agent or $BIN/gpuctl missing"
    echo "FAIL agent binaries missing in $BIN" >"$VTXT"
    exit 2
fi
if ! "$BIN/gpu-agent" --help 2>/dev/null | grep -q -- --runtime-dir; then
    log "FATAL: $BIN/gpu-agent has no --runtime-dir (a build without the MPS tier?)"
    echo "FAIL $BIN/gpu-agent has no --runtime-dir: rebuild it with the MPS tier" >"$VTXT"
    exit 2
fi
{
    date -u
    uname -a
    command -v nvidia-cuda-mps-control || echo "nvidia-cuda-mps-control: not on PATH"
    nvidia-smi --query-gpu=index,name,uuid,driver_version,compute_mode,mig.mode.current,memory.total,memory.used --format=csv 2>&1
    echo "compute apps before the run:"
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv 2>&1
    "$BIN/gpu-agent" --version 2>&1
} >"$W/env.txt" 2>&1
if ((!FAKE)); then
    (HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME=/tmp/gab-hf timeout 120 "$PY" -c 'import torch, transformers, sys
print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__,
      "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")' >"$W/python.txt" 2>&1 &)
fi

printf 'allow_root_workers = true\n' >"$W/agent.toml"
# shellcheck disable=SC2086 # SIMULATE is a single word when set
"$BIN/gpu-agent" --read-only-gpus --config "$W/agent.toml" --socket "$SOCK" --state-dir "$STATE" \
    --runtime-dir "$RUNTIME" ${SIMULATE:+--simulate $SIMULATE} >"$W/agent.log" 2>&1 &
AGENT_PID=$!
for _ in $(seq 100); do ctl status >/dev/null 2>&1 && break; sleep 0.1; done
if ! ctl -o json status >"$W/status-start.json" 2>&1; then
    log "FATAL: the agent does not answer on $SOCK (see agent.log)"
    echo "FAIL the agent did not start (see logs.tar.gz: agent.log)" >>"$VTXT"
    exit 1
fi
log "agent $AGENT_PID answers: driver $(jget "$W/status-start.json" 'd.get("driver_version")'), read_only_gpus $(jget "$W/status-start.json" 'd.get("read_only_gpus")')"

[[ $ONLY == bench ]] || validation
[[ $ONLY == validation ]] || benchmark
log "phases done after $(($(date +%s) - T0))s"
exit 0
