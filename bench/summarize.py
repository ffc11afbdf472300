#!/usr/bin/env python3
"""Turns the benchmark runs of bench/h200_mps.sh into bench.json and bench.md.

Input: RUNS/<run id>/run.json, written by the driver:
    {"id", "kind": "scale"|"interference", "tier": "mps"|"time-slicing", "n", "label",
     "expect": {"<model>": <replicas>}, "roles": {"<model>": "bench"|"victim"|"aggressor"},
     "status": "ok"|"skipped"|"failed", "note", "load_s", "duration_s", ...}
and the workers' results RUNS/<run id>/results/<model>-<replica>.json (bench/model_worker.py).

Per model of a run: requests (all replicas), req/s = requests / duration, and p50 / p99 over all
requests of all replicas (nearest rank on the sorted latencies, index min(n-1, int(q*n)), as in
shared/bench/*.py). Then the tables of shared/reference/mps.md and the targets, each PASS or FAIL.

Usage: summarize.py --runs DIR --out DIR [--duration 8] [--validation validation.txt] [--recovery recover.json]
                    [--meta FILE]
       summarize.py --self-test
"""
import argparse
import json
import math
import os
import sys
import tempfile

NS = (1, 2, 4, 8)

# Targets (the brief): throughput scaling of MPS and its gain over time-slicing at N=8, and the
# latency a capped aggressor leaves the victim.
SCALE_LINEAR = 0.95       # mps N=8 >= 0.95 x 8 x mps N=1
OVER_TS = 1.5             # mps N=8 >= 1.5 x time-slicing N=8
VICTIM_P99 = 1.2          # victim p99 with the aggressor at 25% <= 1.2 x victim p99 alone


def pct(sorted_lat, q):
    """Nearest-rank percentile as the reference scripts compute it; None for no data."""
    if not sorted_lat:
        return None
    return sorted_lat[min(len(sorted_lat) - 1, int(q * len(sorted_lat)))]


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def model_stats(results, duration):
    """results: worker result docs of one model. Returns the model's aggregate numbers."""
    lat = []
    late = []
    for r in results:
        lat.extend(r.get("latencies_s") or [])
        if (r.get("late_s") or 0) > 0.05:
            late.append(r.get("replica"))
    lat.sort()
    n = len(lat)
    ms = lambda v: None if v is None else round(v * 1e3, 3)  # noqa: E731
    return {
        "workers": len(results),
        "requests": n,
        "req_s": round(n / duration, 2) if duration else None,
        "p50_ms": ms(pct(lat, 0.50)),
        "p99_ms": ms(pct(lat, 0.99)),
        "mean_ms": ms(sum(lat) / n) if n else None,
        "max_ms": ms(lat[-1]) if n else None,
        "per_worker_req_s": [round(len(r.get("latencies_s") or []) / duration, 2) if duration else None
                             for r in sorted(results, key=lambda r: int(r.get("replica") or 0))],
        "late_replicas": late,
    }


def read_run(run_dir, default_duration):
    meta = load_json(os.path.join(run_dir, "run.json")) or {"id": os.path.basename(run_dir), "status": "failed",
                                                             "note": "no run.json"}
    duration = float(meta.get("duration_s") or default_duration)
    res_dir = os.path.join(run_dir, "results")
    by_model = {}
    if os.path.isdir(res_dir):
        for name in sorted(os.listdir(res_dir)):
            if not name.endswith(".json"):
                continue
            doc = load_json(os.path.join(res_dir, name))
            if doc is None:
                continue
            by_model.setdefault(doc.get("model") or name.rsplit("-", 1)[0], []).append(doc)
    models = {}
    problems = []
    for model, want in (meta.get("expect") or {}).items():
        got = by_model.get(model, [])
        st = model_stats(got, duration)
        st["role"] = (meta.get("roles") or {}).get(model, model)
        st["expected_workers"] = want
        if len(got) < want and meta.get("status") != "skipped":
            problems.append(f"{model}: {len(got)} of {want} result files")
        if st["late_replicas"]:
            problems.append(f"{model}: replicas {st['late_replicas']} started measuring late")
        models[model] = st
    for model in by_model:
        if model not in models:
            models[model] = model_stats(by_model[model], duration)
    first = next(iter(by_model.values()), [{}])[0] if by_model else {}
    info = first.get("info") or {}
    out = dict(meta)
    out["duration_s"] = duration
    out["models"] = models
    out["problems"] = problems + ([meta["note"]] if meta.get("note") else [])
    out["complete"] = meta.get("status") == "ok" and not problems
    out["worker_info"] = info
    return out


def role(run, name):
    """The stats of the model with this role in a run, or None."""
    if not run:
        return None
    for st in run.get("models", {}).values():
        if st.get("role") == name and st.get("workers"):
            return st
    return None


def ratio(a, b):
    if a is None or b in (None, 0):
        return None
    return round(a / b, 3)


def target(name, value, threshold, ok_if, detail):
    """ok_if: '>=' or '<='. PASS/FAIL, or MISSING when a number is absent."""
    if value is None or threshold is None:
        verdict = "MISSING"
    elif ok_if == ">=":
        verdict = "PASS" if value >= threshold else "FAIL"
    else:
        verdict = "PASS" if value <= threshold else "FAIL"
    return {"name": name, "value": value, "threshold": threshold, "ok_if": ok_if, "result": verdict, "detail": detail}


def build(runs, duration, validation=None, meta=None):
    by_id = {r["id"]: r for r in runs}
    scale = {}
    for tier in ("mps", "time-slicing"):
        for n in NS:
            run = next((r for r in runs if r.get("kind") == "scale" and r.get("tier") == tier and int(r.get("n", 0)) == n), None)
            scale[(tier, n)] = (run, role(run, "bench"))
    rows = []
    solo = {t: (scale[(t, 1)][1] or {}).get("req_s") for t in ("mps", "time-slicing")}
    for n in NS:
        ts_run, ts = scale[("time-slicing", n)]
        mp_run, mp = scale[("mps", n)]
        g = lambda st, k: st.get(k) if st else None  # noqa: E731
        rows.append({
            "n": n,
            "ts_req_s": g(ts, "req_s"), "mps_req_s": g(mp, "req_s"),
            "ts_p50_ms": g(ts, "p50_ms"), "mps_p50_ms": g(mp, "p50_ms"),
            "ts_p99_ms": g(ts, "p99_ms"), "mps_p99_ms": g(mp, "p99_ms"),
            "ts_of_linear": ratio(g(ts, "req_s"), n * solo["time-slicing"] if solo["time-slicing"] else None),
            "mps_of_linear": ratio(g(mp, "req_s"), n * solo["mps"] if solo["mps"] else None),
            "mps_over_ts": ratio(g(mp, "req_s"), g(ts, "req_s")),
            "ts_run": ts_run["id"] if ts_run else None, "mps_run": mp_run["id"] if mp_run else None,
            "ts_complete": bool(ts_run and ts_run["complete"]), "mps_complete": bool(mp_run and mp_run["complete"]),
        })

    def irow(label, run, victim_role="victim", aggressor=True):
        v = role(run, victim_role)
        a = role(run, "aggressor") if aggressor else None
        return {
            "setup": label,
            "run": run["id"] if run else None,
            "victim_p50_ms": v.get("p50_ms") if v else None,
            "victim_p99_ms": v.get("p99_ms") if v else None,
            "victim_req_s": v.get("req_s") if v else None,
            "aggressor_req_s": a.get("req_s") if a else None,
            "aggressor_p50_ms": a.get("p50_ms") if a else None,
            "complete": bool(run and run["complete"]),
        }

    inter = lambda i: next((r for r in runs if r.get("kind") == "interference" and r.get("label") == i), None)  # noqa: E731
    alone_run = scale[("time-slicing", 1)][0]
    alone_mps_run = scale[("mps", 1)][0]
    irows = [
        irow("victim alone (no MPS; = time-slicing N=1)", alone_run, "bench", aggressor=False),
        irow("victim alone under MPS (= MPS N=1)", alone_mps_run, "bench", aggressor=False),
        irow("MPS, aggressor uncapped", inter("mps-uncapped")),
        irow("MPS, aggressor at compute = 25", inter("mps-capped-25")),
        irow("time-slicing, both", inter("time-slicing")),
    ]

    r8 = rows[-1]
    capped = irows[3]
    alone = irows[0]
    targets = [
        target(f"MPS N=8 req/s >= {SCALE_LINEAR} x 8 x MPS N=1",
               r8["mps_req_s"], round(SCALE_LINEAR * 8 * solo["mps"], 2) if solo["mps"] else None, ">=",
               f"MPS N=1 = {solo['mps']} req/s; N=8 reaches {r8['mps_of_linear']} of linear"),
        target(f"MPS N=8 req/s >= {OVER_TS} x time-slicing N=8",
               r8["mps_req_s"], round(OVER_TS * r8["ts_req_s"], 2) if r8["ts_req_s"] else None, ">=",
               f"time-slicing N=8 = {r8['ts_req_s']} req/s; MPS/time-slicing = {r8['mps_over_ts']}"),
        target(f"victim p99 with aggressor at compute = 25 <= {VICTIM_P99} x victim p99 alone",
               capped["victim_p99_ms"],
               round(VICTIM_P99 * alone["victim_p99_ms"], 3) if alone["victim_p99_ms"] else None, "<=",
               f"alone p99 = {alone['victim_p99_ms']} ms; capped p99 = {capped['victim_p99_ms']} ms "
               f"({ratio(capped['victim_p99_ms'], alone['victim_p99_ms'])} x alone; "
               f"{ratio(capped['victim_p99_ms'], irows[1]['victim_p99_ms'])} x alone under MPS)"),
    ]
    return {
        "meta": meta or {},
        "duration_s": duration,
        "scaling": rows,
        "interference": irows,
        "targets": targets,
        "validation": validation,
        "runs": by_id,
    }


def fmt(v, digits=1):
    if v is None:
        return "-"
    if isinstance(v, float) and math.isnan(v):
        return "-"
    return f"{v:.{digits}f}" if isinstance(v, (int, float)) else str(v)


def markdown(doc):
    meta = doc.get("meta") or {}
    out = ["# gpu-agent MPS benchmark on the H200", ""]
    if meta:
        out.append("Run: " + ", ".join(f"{k} = {v}" for k, v in meta.items() if not isinstance(v, (dict, list))))
        out.append("")
    out += [f"Each measurement: {fmt(doc['duration_s'], 0)} s, all workers starting together, closed loop; "
            "req/s = all requests / duration; p50/p99 over all requests of all replicas. Workers are started by "
            "gpu-agent (`isolation = \"mps\"` on an `mps` GPU, or `time-slicing`).", ""]
    out += ["## Targets", "", "| target | value | threshold | result |", "|---|---|---|---|"]
    for t in doc["targets"]:
        out.append(f"| {t['name']} | {fmt(t['value'], 2)} | {t['ok_if']} {fmt(t['threshold'], 2)} | **{t['result']}** |")
    out.append("")
    for t in doc["targets"]:
        out.append(f"- {t['result']}: {t['name']} ({t['detail']})")
    out += ["", "## N small models on one GPU (6 x 768 GPT-2 shape, fp16, batch 1 x 32 tokens)", "",
            "| N | time-slicing req/s | MPS req/s | time-slicing p50 ms | MPS p50 ms | time-slicing p99 ms | MPS p99 ms "
            "| time-slicing of linear | MPS of linear | MPS / time-slicing |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["scaling"]:
        mark = lambda run, ok: "" if ok or not run else " (incomplete)"  # noqa: E731
        out.append(f"| {r['n']} | {fmt(r['ts_req_s'], 0)}{mark(r['ts_run'], r['ts_complete'])} "
                   f"| {fmt(r['mps_req_s'], 0)}{mark(r['mps_run'], r['mps_complete'])} "
                   f"| {fmt(r['ts_p50_ms'], 2)} | {fmt(r['mps_p50_ms'], 2)} | {fmt(r['ts_p99_ms'], 2)} | {fmt(r['mps_p99_ms'], 2)} "
                   f"| {fmt(r['ts_of_linear'], 2)} | {fmt(r['mps_of_linear'], 2)} | {fmt(r['mps_over_ts'], 2)} |")
    out += ["", "## A light model next to a heavy one", "",
            "Victim: 6 x 768, batch 1 x 32 tokens. Aggressor: 24 x 2048, batch 16 x 512 tokens. One plan per row "
            "(two models); `compute = 25` is the aggressor's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, the victim is uncapped. "
            "The two 'alone' rows are the N=1 runs above (same worker, same flags).", "",
            "| setup | victim p50 ms | victim p99 ms | victim req/s | aggressor req/s |", "|---|---|---|---|---|"]
    for r in doc["interference"]:
        inc = "" if r["complete"] else (" (incomplete)" if r["run"] else " (not run)")
        out.append(f"| {r['setup']}{inc} | {fmt(r['victim_p50_ms'], 2)} | {fmt(r['victim_p99_ms'], 2)} "
                   f"| {fmt(r['victim_req_s'], 0)} | {fmt(r['aggressor_req_s'], 1)} |")
    v = doc.get("validation")
    if v:
        out += ["", f"## Validation ({v['passed']} PASS, {v['failed']} FAIL; see validation.txt)", ""]
        for line in v.get("lines", []):
            out.append(f"- {line}")
        rec = v.get("recovery")
        if rec:
            w = rec.get("wall_ms") or {}
            out += ["", "| MPS control daemon killed (kill -9): | ms |", "|---|---|",
                    f"| agent's own figure (mps_recovered: down to daemon and workers restarted) | {fmt(rec.get('agent_event_ms'), 0)} |",
                    f"| wall clock: gpuctl shows the daemon down | {fmt(w.get('agent_saw_down'), 0)} |",
                    f"| wall clock: new daemon running | {fmt(w.get('daemon_back'), 0)} |",
                    f"| wall clock: all workers running with new pids | {fmt(w.get('workers_restarted'), 0)} |",
                    f"| wall clock: all workers READY again (model reloaded) | {fmt(w.get('all_ready'), 0)} |"]
    out += ["", "## Runs", "", "| run | status | load s | problems |", "|---|---|---|---|"]
    for rid, r in doc["runs"].items():
        out.append(f"| {rid} | {r.get('status')} | {fmt(r.get('load_s'), 1)} | {'; '.join(r.get('problems') or []) or '-'} |")
    info = next((r.get("worker_info") for r in doc["runs"].values() if r.get("worker_info")), None)
    if info:
        out += ["", "Worker software: " + ", ".join(f"{k} {v}" for k, v in info.items())]
    return "\n".join(out) + "\n"


def write_atomic(path, text):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def load_validation(path, recovery_path=None):
    """validation.txt (its PASS/FAIL/INFO lines) and the recovery figures of bench/poll.py recover."""
    lines = []
    if path:
        try:
            with open(path) as f:
                lines = [line.rstrip() for line in f if line.startswith(("PASS", "FAIL", "INFO"))]
        except OSError:
            pass
    rec = load_json(recovery_path) if recovery_path else None
    if not lines and not rec:
        return None
    doc = {"lines": lines, "passed": sum(x.startswith("PASS") for x in lines),
           "failed": sum(x.startswith("FAIL") for x in lines)}
    if rec:
        doc["recovery"] = {k: rec.get(k) for k in ("ok", "agent_event_ms", "agent_event_workers", "wall_ms", "event_times",
                                                   "old_daemon_pid", "new_daemon_pid", "daemon_restarts", "problems")}
    return doc


def summarize(runs_dir, out_dir, duration, validation_path=None, meta_path=None, recovery_path=None):
    runs = []
    if os.path.isdir(runs_dir):
        for name in sorted(os.listdir(runs_dir)):
            d = os.path.join(runs_dir, name)
            if os.path.isdir(d):
                runs.append(read_run(d, duration))
    validation = load_validation(validation_path, recovery_path)
    meta = load_json(meta_path) if meta_path else None
    doc = build(runs, duration, validation, meta)
    os.makedirs(out_dir, exist_ok=True)
    write_atomic(os.path.join(out_dir, "bench.json"), json.dumps(doc, indent=1, sort_keys=False) + "\n")
    md = markdown(doc)
    write_atomic(os.path.join(out_dir, "bench.md"), md)
    return doc, md


# ---------------------------------------------------------------------------------------------
# Self-test: synthetic runs with known numbers.

def _fake_run(root, rid, kind, tier, n, label, models, lat_fn, duration=8.0, status="ok", missing=0):
    d = os.path.join(root, rid)
    os.makedirs(os.path.join(d, "results"))
    expect = {m: k for m, (k, _) in models.items()}
    roles = {m: r for m, (_, r) in models.items()}
    with open(os.path.join(d, "run.json"), "w") as f:
        json.dump({"id": rid, "kind": kind, "tier": tier, "n": n, "label": label, "expect": expect, "roles": roles,
                   "status": status, "duration_s": duration, "load_s": 12.5}, f)
    for m, (k, _) in models.items():
        for r in range(k - (missing if m == next(iter(models)) else 0)):
            lat = lat_fn(m, r)
            with open(os.path.join(d, "results", f"{m}-{r}.json"), "w") as f:
                json.dump({"model": m, "replica": str(r), "late_s": 0.0, "latencies_s": lat,
                           "info": {"backend": "fake"}}, f)


def self_test():
    failures = []
    total = [0]

    def check(cond, what):
        total[0] += 1
        if not cond:
            failures.append(what)

    # Percentiles: nearest rank as the reference scripts.
    data = sorted(i / 1000 for i in range(1, 101))   # 1..100 ms
    check(pct(data, 0.5) == 0.051, f"p50 of 1..100 = {pct(data, 0.5)}")
    check(pct(data, 0.99) == 0.1, f"p99 of 1..100 = {pct(data, 0.99)}")
    check(pct([0.007], 0.99) == 0.007, "p99 of one value")
    check(pct([], 0.5) is None, "empty")
    st = model_stats([{"replica": "0", "latencies_s": [0.001] * 40}, {"replica": "1", "latencies_s": [0.003] * 40}], 8.0)
    check(st["requests"] == 80 and st["req_s"] == 10.0, f"req/s {st}")
    check(st["p50_ms"] == 3.0 and st["p99_ms"] == 3.0 and st["per_worker_req_s"] == [5.0, 5.0], f"stats {st}")

    def const(ms, count):
        return lambda m, r: [ms / 1e3] * count

    with tempfile.TemporaryDirectory() as root:
        runs = os.path.join(root, "runs")
        os.makedirs(runs)
        # MPS: N=1 2000 requests over 8 s (250 req/s); N=8: 8 x 1950 (1950 req/s = 0.975 of linear).
        # time-slicing N=8: 8 x 1000 (1000 req/s): MPS/ts = 1.95.
        _fake_run(runs, "01-mps-1", "scale", "mps", 1, "", {"bench": (1, "bench")}, const(4.0, 2000))
        _fake_run(runs, "02-ts-1", "scale", "time-slicing", 1, "", {"bench": (1, "bench")}, const(3.0, 2400))
        _fake_run(runs, "03-mps-8", "scale", "mps", 8, "", {"bench": (8, "bench")}, const(4.1, 1950))
        _fake_run(runs, "04-ts-8", "scale", "time-slicing", 8, "", {"bench": (8, "bench")}, const(8.0, 1000))
        # victim alone p99 = 3.0 ms (ts N=1); capped: 99 requests at 3 ms and one at 10 ms -> p99 = 10 ms: FAIL.
        _fake_run(runs, "05-mps-capped", "interference", "mps", 2, "mps-capped-25",
                  {"victim": (1, "victim"), "aggressor": (1, "aggressor")},
                  lambda m, r: [0.003] * 99 + [0.010] if m == "victim" else [0.07] * 80)
        # uncapped: one of two result files missing -> incomplete
        _fake_run(runs, "06-mps-uncapped", "interference", "mps", 2, "mps-uncapped",
                  {"victim": (1, "victim"), "aggressor": (1, "aggressor")},
                  lambda m, r: [0.02] * 10, missing=1)
        out = os.path.join(root, "out")
        doc, md = summarize(runs, out, 8.0, None, None)
        t = {x["name"].split(" ")[0] + str(i): x for i, x in enumerate(doc["targets"])}
        r8 = doc["scaling"][3]
        check(r8["mps_req_s"] == 1950.0 and r8["ts_req_s"] == 1000.0, f"N=8 row {r8}")
        check(r8["mps_of_linear"] == 0.975, f"of linear {r8['mps_of_linear']}")
        check(t["MPS0"]["result"] == "PASS" and t["MPS0"]["threshold"] == 1900.0, f"linear target {t['MPS0']}")
        check(t["MPS1"]["result"] == "PASS" and t["MPS1"]["threshold"] == 1500.0, f"ts target {t['MPS1']}")
        check(t["victim2"]["result"] == "FAIL" and t["victim2"]["value"] == 10.0 and t["victim2"]["threshold"] == 3.6,
              f"victim target {t['victim2']}")
        check(doc["scaling"][1]["mps_req_s"] is None, "N=2 missing")
        check(not doc["runs"]["06-mps-uncapped"]["complete"], "missing result file -> incomplete")
        check(doc["interference"][2]["complete"] is False, "uncapped row incomplete")
        check("**PASS**" in md and "**FAIL**" in md and "| 8 | 1000 | 1950 |" in md, "markdown")
        check(os.path.exists(os.path.join(out, "bench.json")), "bench.json written")
        json.load(open(os.path.join(out, "bench.json")))
        vt = os.path.join(root, "validation.txt")
        with open(vt, "w") as f:
            f.write("PASS a\nFAIL b\nINFO c\nnoise\n")
        rj = os.path.join(root, "recover.json")
        with open(rj, "w") as f:
            json.dump({"ok": True, "agent_event_ms": 812, "wall_ms": {"all_ready": 15000}}, f)
        doc3, md3 = summarize(runs, os.path.join(root, "out3"), 8.0, vt, None, rj)
        check(doc3["validation"]["passed"] == 1 and doc3["validation"]["failed"] == 1 and len(doc3["validation"]["lines"]) == 3,
              f"validation {doc3['validation']}")
        check("| 812 |" in md3 and "| 15000 |" in md3, "recovery table")
        # Nothing at all: every target MISSING, no crash.
        doc2, _ = summarize(os.path.join(root, "none"), os.path.join(root, "out2"), 8.0)
        check(all(x["result"] == "MISSING" for x in doc2["targets"]), "empty -> MISSING")
    for f in failures:
        print("FAIL:", f)
    print(f"self-test: {total[0] - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs")
    p.add_argument("--out")
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--validation", help="validation.txt")
    p.add_argument("--recovery", help="recover.json of bench/poll.py")
    p.add_argument("--meta")
    p.add_argument("--self-test", action="store_true")
    a = p.parse_args(argv)
    if a.self_test:
        return self_test()
    if not a.runs or not a.out:
        p.error("--runs and --out are required")
    doc, _ = summarize(a.runs, a.out, a.duration, a.validation, a.meta, a.recovery)
    for t in doc["targets"]:
        print(f"{t['result']}: {t['name']}: {t['detail']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
