#!/usr/bin/env python3
"""Waits and checks against a running gpu-agent, for bench/h200_mps.sh (standard library only).

Every subcommand talks to the agent through `gpuctl -o json`, prints one summary line, writes its
full answer as JSON (--out), and exits 0 when what it waited for or checked holds, 1 otherwise.

  offsets                      sizes of the worker logs now (so later waits read only new lines)
  wait-ready --expect M:N,...  until each expected worker runs and printed READY (since --offsets)
  wait-gone                    until the agent has no live worker and no MPS daemon, and every
                               worker pid seen so far (--pids-log) is gone
  clients --expect M:N,...     each expected worker's pid is an MPS client in `gpuctl gpus`,
                               attributed to its model/replica (NVML through pynvml as a cross-check)
  same-pids --before FILE      the workers' pids are those of an earlier `workers` answer
  recover --expect M:N,...     kill -9 the MPS control daemon and time the recovery (100 ms polls)
  daemon                       print the first MPS daemon's pid

Expected workers: `bench:8,hog:1` means bench replicas 0-7 and hog replica 0.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time


def now():
    return time.monotonic()


class Agent:
    def __init__(self, a):
        self.gpuctl = os.path.join(a.bin, "gpuctl")
        self.sock = a.sock
        self.logs = os.path.join(a.state, "logs")
        self.pids_log = a.pids_log

    def run(self, *args, as_json=True, timeout=20):
        cmd = [self.gpuctl, "--socket", self.sock] + (["-o", "json"] if as_json else []) + list(args)
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None if as_json else f"gpuctl failed: {e}"
        if not as_json:
            return p.stdout + p.stderr
        try:
            return json.loads(p.stdout)
        except ValueError:
            return None

    def workers(self):
        doc = self.run("workers")
        ws = (doc or {}).get("workers")
        if ws is None:
            return None
        if self.pids_log:
            pids = sorted({w["pid"] for w in ws if w.get("pid")})
            if pids:
                with open(self.pids_log, "a") as f:
                    f.write("".join(f"{p}\n" for p in pids))
        return ws

    def status(self):
        return self.run("status")

    def gpus(self):
        return self.run("gpus")

    def log_path(self, model, replica):
        return os.path.join(self.logs, f"{model}.{replica}.log")


def expect_list(spec):
    out = []
    for part in filter(None, (spec or "").split(",")):
        model, _, n = part.partition(":")
        out += [(model, r) for r in range(int(n or 1))]
    return out


def key(w):
    return (w.get("model"), int(w.get("replica") or 0))


def log_sizes(agent):
    sizes = {}
    if os.path.isdir(agent.logs):
        for name in os.listdir(agent.logs):
            try:
                sizes[name] = os.path.getsize(os.path.join(agent.logs, name))
            except OSError:
                pass
    return sizes


def log_since(agent, model, replica, offsets):
    path = agent.log_path(model, replica)
    try:
        with open(path, "rb") as f:
            f.seek(offsets.get(os.path.basename(path), 0))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def has_line(text, prefix):
    return any(line.startswith(prefix) for line in text.splitlines())


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def is_worker(pid):
    """Whether pid is (still) one of our model workers, not an unrelated process that reused it."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"model_worker.py" in f.read()
    except OSError:
        return False


def zombie_or_gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return not alive(pid)


def dump(a, doc):
    if a.out:
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, a.out)


def load_offsets(path):
    if not path:
        return {}
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


# --------------------------------------------------------------------------------------------

def cmd_offsets(a, agent):
    doc = log_sizes(agent)
    dump(a, doc)
    print(f"offsets: {len(doc)} log(s)")
    return 0


def cmd_wait_ready(a, agent):
    want = expect_list(a.expect)
    offsets = load_offsets(a.offsets)
    t0 = now()
    deadline = t0 + a.timeout
    ready_at = {}
    problems = []
    ws = []
    dead_since = {}
    while True:
        ws = agent.workers() or []
        by = {key(w): w for w in ws}
        for k in want:
            w = by.get(k)
            text = log_since(agent, k[0], k[1], offsets)
            if k not in ready_at and w and w.get("state") == "running" and w.get("pid") and has_line(text, "READY"):
                ready_at[k] = round(now() - t0, 2)
            # A worker that exited will not come back by itself (the agent restarts on apply).
            if (w is None or w.get("state") in ("stopped", "failed", "backoff")) and k not in ready_at:
                dead_since.setdefault(k, now())
            else:
                dead_since.pop(k, None)
        stuck = [k for k, t in dead_since.items() if now() - t > a.dead_grace]
        if len(ready_at) == len(want):
            ok = True
            break
        if stuck:
            problems += [f"{m}.{r}: not running ({(by.get((m, r)) or {}).get('state', 'absent')}, "
                         f"last_exit {(by.get((m, r)) or {}).get('last_exit')})" for m, r in stuck]
            ok = False
            break
        if now() > deadline:
            problems.append(f"timeout after {a.timeout}s: {len(ready_at)} of {len(want)} ready")
            ok = False
            break
        time.sleep(a.interval)
    # Every worker's log tail, for the report, when something went wrong.
    tails = {}
    if not ok:
        for m, r in want:
            if (m, r) not in ready_at:
                tails[f"{m}.{r}"] = log_since(agent, m, r, offsets)[-1500:]
    doc = {"ok": ok, "elapsed_s": round(now() - t0, 2), "ready_at_s": {f"{m}.{r}": t for (m, r), t in ready_at.items()},
           "workers": ws, "problems": problems, "log_tails": tails}
    dump(a, doc)
    print(f"wait-ready: {'ok' if ok else 'FAILED'}: {len(ready_at)}/{len(want)} ready after {doc['elapsed_s']}s"
          + (f"; {'; '.join(problems)}" if problems else ""))
    for name, tail in tails.items():
        print(f"--- {name} log tail ---\n{tail.rstrip()}")
    return 0 if ok else 1


def read_pids(path):
    try:
        with open(path) as f:
            return {int(x) for x in f.read().split()}
    except (OSError, ValueError):
        return set()


def cmd_wait_gone(a, agent):
    t0 = now()
    deadline = t0 + a.timeout
    seen = read_pids(agent.pids_log) if agent.pids_log else set()
    while True:
        ws = agent.workers()
        st = agent.status() or {}
        live = [w for w in (ws or []) if w.get("pid") and w.get("state") in ("starting", "running", "stopping")]
        daemons = [d for d in st.get("mps_daemons") or [] if d.get("pid")]
        pids = [p for p in seen if not zombie_or_gone(p) and is_worker(p)]
        if ws is not None and not live and (not daemons or a.allow_daemons) and not pids:
            ok = True
            break
        if now() > deadline:
            ok = False
            break
        time.sleep(a.interval)
    doc = {"ok": ok, "elapsed_s": round(now() - t0, 2), "live_workers": live if not ok else [],
           "daemons": daemons if not ok else [], "pids_alive": sorted(pids) if not ok else []}
    dump(a, doc)
    print(f"wait-gone: {'ok' if ok else 'FAILED'} after {doc['elapsed_s']}s"
          + ("" if ok else f": live workers {[(w['model'], w['replica'], w['pid']) for w in live]}, "
             f"daemons {[d.get('pid') for d in daemons]}, pids alive {sorted(pids)}"))
    return 0 if ok else 1


def nvml_mps_pids():
    """Pids NVML lists as MPS compute processes on GPU 0, or None without pynvml."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        fn = getattr(pynvml, "nvmlDeviceGetMPSComputeRunningProcesses", None)
        if fn is None:
            return None
        return sorted(p.pid for p in fn(h))
    except Exception as e:  # noqa: BLE001
        return f"error: {e}"


def check_clients(agent, want):
    ws = agent.workers() or []
    gpus = agent.gpus() or {}
    procs = {}
    for g in gpus.get("gpus") or []:
        for p in g.get("processes") or []:
            procs[p.get("pid")] = dict(p, gpu=g.get("index"))
    by = {key(w): w for w in ws}
    rows = []
    for m, r in want:
        w = by.get((m, r)) or {}
        pid = w.get("pid")
        p = procs.get(pid) if pid else None
        attributed = bool(p) and p.get("model") == m and int(p.get("replica") if p.get("replica") is not None else -1) == r
        rows.append({"model": m, "replica": r, "pid": pid, "state": w.get("state"), "on_gpu": bool(p),
                     "mps_client": bool(p and p.get("mps_client")), "attributed": attributed,
                     "used_mib": p.get("used_mib") if p else None,
                     "worker_gpu_memory_used_mib": w.get("gpu_memory_used_mib"),
                     "ok": bool(p and p.get("mps_client") and attributed)})
    return rows, procs


def cmd_clients(a, agent):
    want = expect_list(a.expect)
    t0 = now()
    while True:
        rows, procs = check_clients(agent, want)
        if all(x["ok"] for x in rows) or now() - t0 > a.timeout:
            break
        time.sleep(0.5)
    nvml = nvml_mps_pids()
    ok = all(x["ok"] for x in rows)
    if isinstance(nvml, list):
        for x in rows:
            x["nvml_mps_process"] = x["pid"] in nvml
    doc = {"ok": ok, "workers": rows, "gpu_processes": list(procs.values()), "nvml_mps_pids": nvml}
    dump(a, doc)
    good = sum(x["ok"] for x in rows)
    print(f"clients: {'ok' if ok else 'FAILED'}: {good}/{len(rows)} workers are MPS clients attributed to their model/replica")
    for x in rows:
        if not x["ok"]:
            print(f"  {x['model']}.{x['replica']} pid {x['pid']} state {x['state']}: on_gpu={x['on_gpu']} "
                  f"mps_client={x['mps_client']} attributed={x['attributed']}")
    return 0 if ok else 1


def cmd_same_pids(a, agent):
    with open(a.before) as f:
        before = {key(w): w.get("pid") for w in json.load(f).get("workers", [])}
    want = expect_list(a.expect)
    ws = agent.workers() or []
    after = {key(w): w for w in ws}
    rows = []
    for k in want:
        w = after.get(k) or {}
        same = before.get(k) is not None and w.get("pid") == before.get(k)
        rows.append({"worker": f"{k[0]}.{k[1]}", "before": before.get(k), "after": w.get("pid"), "state": w.get("state"),
                     "alive": bool(w.get("pid")) and alive(w["pid"]) and not zombie_or_gone(w["pid"]),
                     "restarts": w.get("restarts"), "ok": same and w.get("state") == "running"})
    ok = all(x["ok"] and x["alive"] for x in rows)
    doc = {"ok": ok, "workers": rows}
    dump(a, doc)
    print(f"same-pids: {'ok' if ok else 'FAILED'}: {sum(x['ok'] and x['alive'] for x in rows)}/{len(rows)} "
          "running with their earlier pid")
    return 0 if ok else 1


def daemon_of(st, name=None):
    ds = (st or {}).get("mps_daemons") or []
    if name:
        ds = [d for d in ds if d.get("name") == name]
    return ds[0] if ds else None


def cmd_daemon(a, agent):
    d = daemon_of(agent.status())
    if not d or not d.get("pid"):
        print("")
        return 1
    print(d["pid"])
    return 0


RECOVERED = re.compile(r"(\d+) worker\(s\) started again, (\d+) ms after it went down")


def cmd_recover(a, agent):
    want = expect_list(a.expect)
    st = agent.status()
    d = daemon_of(st)
    if not d or not d.get("pid"):
        doc = {"ok": False, "problems": ["no MPS daemon with a pid in gpuctl status"], "status": st}
        dump(a, doc)
        print("recover: FAILED: no MPS daemon")
        return 1
    name, old_daemon = d.get("name"), d["pid"]
    before = {key(w): w.get("pid") for w in agent.workers() or []}
    offsets = log_sizes(agent)
    marks = {}
    timeline = []
    t0 = now()
    wall0 = time.time()
    os.kill(old_daemon, signal.SIGKILL)
    deadline = t0 + a.timeout
    last = None
    while now() < deadline:
        t = round(now() - t0, 3)
        st = agent.status()
        ws = agent.workers()
        if st is None or ws is None:  # gpuctl did not answer this time: no conclusions
            time.sleep(a.interval)
            continue
        dd = daemon_of(st, name) or {}
        by = {key(w): w for w in ws or []}
        snap = (dd.get("state"), dd.get("pid"), tuple((k, (by.get(k) or {}).get("state"), (by.get(k) or {}).get("pid")) for k in want))
        if snap != last:
            timeline.append({"t_s": t, "daemon": {"state": dd.get("state"), "pid": dd.get("pid"), "restarts": dd.get("restarts")},
                             "workers": {f"{k[0]}.{k[1]}": [(by.get(k) or {}).get("state"), (by.get(k) or {}).get("pid")] for k in want}})
            last = snap
        if "agent_saw_down" not in marks and (dd.get("state") != "running" or dd.get("pid") != old_daemon):
            marks["agent_saw_down"] = t
        if "daemon_back" not in marks and dd.get("state") == "running" and dd.get("pid") and dd.get("pid") != old_daemon and alive(dd["pid"]):
            marks["daemon_back"] = t
        new = [k for k in want if (by.get(k) or {}).get("state") == "running" and (by.get(k) or {}).get("pid")
               and by[k]["pid"] != before.get(k)]
        if "workers_restarted" not in marks and "daemon_back" in marks and len(new) == len(want):
            marks["workers_restarted"] = t
        ready = [k for k in new if has_line(log_since(agent, k[0], k[1], offsets), "READY")]
        if "workers_restarted" in marks and len(ready) == len(want):
            marks["all_ready"] = t
            break
        time.sleep(max(0.0, a.interval - ((now() - t0) - t)))
    events = ((agent.run("events") or {}).get("events")) or []
    new_events = [e for e in events if (e.get("at_unix_ms") or 0) >= wall0 * 1e3 - 500]
    rec = [e for e in new_events if e.get("kind") == "mps_recovered" or "mps_recovered" in str(e.get("message"))]
    down = [e for e in new_events if e.get("kind") == "mps_down"]
    agent_ms = agent_workers = None
    if rec:
        m = RECOVERED.search(rec[-1].get("message") or "")
        if m:
            agent_workers, agent_ms = int(m.group(1)), int(m.group(2))
    event_wall = {
        "mps_down_after_kill_ms": round(down[0]["at_unix_ms"] - wall0 * 1e3) if down else None,
        "mps_recovered_after_kill_ms": round(rec[-1]["at_unix_ms"] - wall0 * 1e3) if rec else None,
    }
    dd = daemon_of(agent.status(), name) or {}
    ok = "all_ready" in marks and agent_ms is not None
    problems = []
    if "all_ready" not in marks:
        problems.append(f"not recovered within {a.timeout}s: reached {sorted(marks)}")
    if agent_ms is None:
        problems.append("no mps_recovered event with a time in gpuctl events")
    if agent_workers is not None and agent_workers != len(want):
        problems.append(f"the agent restarted {agent_workers} worker(s), expected {len(want)}")
        ok = False
    # How the old clients ended: what their logs say after the kill.
    old_ends = {}
    for m_, r in want:
        text = log_since(agent, m_, r, offsets)
        head = text.split("READY")[0][-800:] if "READY" in text else text[-800:]
        old_ends[f"{m_}.{r}"] = head
    doc = {
        "ok": ok, "problems": problems, "daemon": name, "old_daemon_pid": old_daemon, "new_daemon_pid": dd.get("pid"),
        "daemon_restarts": dd.get("restarts"), "killed_at_unix": wall0,
        "wall_ms": {k: round(v * 1e3) for k, v in marks.items()},
        "agent_event_ms": agent_ms, "agent_event_workers": agent_workers, "agent_event": rec[-1] if rec else None,
        "event_times": event_wall,
        "old_worker_pids": {f"{k[0]}.{k[1]}": v for k, v in before.items() if k in want},
        "events": new_events, "timeline": timeline, "logs_after_kill": old_ends,
    }
    dump(a, doc)
    w = doc["wall_ms"]
    print(f"recover: {'ok' if ok else 'FAILED'}: agent event {agent_ms} ms ({agent_workers} workers); wall: agent saw it "
          f"{w.get('agent_saw_down')} ms, daemon back {w.get('daemon_back')} ms, workers restarted {w.get('workers_restarted')} ms, "
          f"all READY {w.get('all_ready')} ms" + (f"; {'; '.join(problems)}" if problems else ""))
    return 0 if ok else 1


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=".device/bin")
    p.add_argument("--sock", required=True)
    p.add_argument("--state", required=True, help="the agent's state dir (worker logs in STATE/logs)")
    p.add_argument("--pids-log", help="append every worker pid seen here (for last-resort cleanup)")
    p.add_argument("--out", help="write the full answer here (JSON)")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("offsets")
    s = sub.add_parser("wait-ready")
    s.add_argument("--expect", required=True)
    s.add_argument("--offsets")
    s.add_argument("--timeout", type=float, default=180)
    s.add_argument("--interval", type=float, default=0.25)
    s.add_argument("--dead-grace", type=float, default=3.0, help="a worker not running this long fails the wait")
    s = sub.add_parser("wait-gone")
    s.add_argument("--timeout", type=float, default=60)
    s.add_argument("--interval", type=float, default=0.2)
    s.add_argument("--allow-daemons", action="store_true")
    s = sub.add_parser("clients")
    s.add_argument("--expect", required=True)
    s.add_argument("--timeout", type=float, default=10)
    s = sub.add_parser("same-pids")
    s.add_argument("--expect", required=True)
    s.add_argument("--before", required=True)
    sub.add_parser("daemon")
    s = sub.add_parser("recover")
    s.add_argument("--expect", required=True)
    s.add_argument("--timeout", type=float, default=150)
    s.add_argument("--interval", type=float, default=0.1)
    a = p.parse_args(argv)
    agent = Agent(a)
    return {"offsets": cmd_offsets, "wait-ready": cmd_wait_ready, "wait-gone": cmd_wait_gone, "clients": cmd_clients,
            "same-pids": cmd_same_pids, "daemon": cmd_daemon, "recover": cmd_recover}[a.cmd](a, agent)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
