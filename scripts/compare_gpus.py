#!/usr/bin/env python3
"""Compares what gpu-agent reports (gpuctl -o json) with what nvidia-smi reports, field by field.

Usage: compare_gpus.py DIR   where DIR holds gpus.json, profiles0.json (gpuctl -o json gpus /
profiles 0), query.csv (nvidia-smi --query-gpu=index,name,uuid,pci.device_id,pci.bus_id,
memory.total,memory.used,mig.mode.current,mig.mode.pending,compute_mode --format=csv,noheader,nounits),
lgip.txt (nvidia-smi mig -lgip) and lgipp.txt (nvidia-smi mig -lgipp). Prints one line per
compared field and exits 1 if any differs."""
import json, re, sys

d = sys.argv[1]
gpus = json.load(open(f"{d}/gpus.json"))["gpus"]
prof = json.load(open(f"{d}/profiles0.json"))["profiles"]
rows = []

def check(what, agent, smi):
    ok = agent == smi
    rows.append(ok)
    print(f"{'same' if ok else 'DIFF'}  {what}: agent={agent!r} nvidia-smi={smi!r}")

for line in open(f"{d}/query.csv"):
    f = [x.strip() for x in line.split(",")]
    if len(f) < 10:
        continue
    i = int(f[0]); g = gpus[i]
    check(f"gpu{i}.name", g["name"], f[1])
    check(f"gpu{i}.uuid", g["uuid"], f[2])
    check(f"gpu{i}.pci_device_id", g["pci_device_id"], f[3].lower())
    check(f"gpu{i}.pci_bus_id", g["pci_bus_id"].upper(), f[4].upper())
    check(f"gpu{i}.memory_mib", g["memory_mib"], int(f[5]))
    check(f"gpu{i}.memory_used_mib", g["memory_used_mib"], int(f[6]))
    check(f"gpu{i}.mig.current", g["mig"]["current"], f[7] == "Enabled")
    check(f"gpu{i}.mig.pending", g["mig"]["pending"], f[8] == "Enabled")
    check(f"gpu{i}.compute_mode", g["compute_mode"], {"Default": "default", "Exclusive_Process": "exclusive_process", "Prohibited": "prohibited"}.get(f[9], f[9]))

# nvidia-smi mig -lgip: "|   0  MIG 1g.18gb         19     7/7        16.00      No     16     1     0   |"
# followed by "|                                                               1     1     0   |" (CE JPEG OFA)
lines = open(f"{d}/lgip.txt").read().splitlines()
smi = {}
for n, line in enumerate(lines):
    m = re.match(r"\|\s+(\d+)\s+MIG (\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\|", line)
    if not m:
        continue
    nxt = re.findall(r"\d+", lines[n + 1])
    smi[int(m.group(3))] = dict(name=m.group(2), total=int(m.group(5)), gib=float(m.group(6)), sm=int(m.group(8)),
                                dec=int(m.group(9)), enc=int(m.group(10)), ce=int(nxt[0]), jpeg=int(nxt[1]), ofa=int(nxt[2]))
check("profile ids (nvidia-smi order)", [p["id"] for p in prof], list(smi))
for p in prof:
    s = smi.get(p["id"], {})
    check(f"profile {p['id']}.name", p["name"], s.get("name"))
    check(f"profile {p['id']}.max", p["max"], s.get("total"))
    check(f"profile {p['id']}.memory GiB", round(p["memory_mib"] / 1024, 2), s.get("gib"))
    check(f"profile {p['id']}.sm", p["sm"], s.get("sm"))
    check(f"profile {p['id']}.engines ce/dec/enc/jpeg/ofa", [p["copy_engines"], p["decoders"], p["encoders"], p["jpegs"], p["ofas"]],
          [s.get(k) for k in ("ce", "dec", "enc", "jpeg", "ofa")])

# nvidia-smi mig -lgipp: "GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1"
for line in open(f"{d}/lgipp.txt"):
    m = re.match(r"GPU\s+0 Profile ID\s+(\d+) Placements?\s*: \{([\d,]+)\}:(\d+)", line.strip())
    if not m:
        continue
    pid, starts, size = int(m.group(1)), [int(x) for x in m.group(2).split(",")], int(m.group(3))
    p = next((p for p in prof if p["id"] == pid), None)
    check(f"profile {pid}.placements", [(x["start"], x["size"]) for x in p["placements"]] if p else None, [(s, size) for s in starts])

print(f"{sum(rows)} same, {len(rows) - sum(rows)} different")
sys.exit(0 if all(rows) else 1)
