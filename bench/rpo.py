#!/usr/bin/env python3
"""RPO (issue: part 6): how many acknowledged writes are lost when the warden and etcd die together.

Each round: a warden (release) with a local file store and the given --delta-snapshot-period runs
etcd; 8 writer threads put keys through etcd's JSON gateway and record each acknowledged key with its
time; after a random 5-15 s both processes are SIGKILLed at the same instant (the host dies); the
store is restored into a new dir and the acknowledged keys that are missing are counted. The goal:
no more than the writes of one delta period plus one second.

Usage: bench/rpo.py [--etcd PATH] [--warden PATH] [--periods 1s,10s] [--rounds 3]
"""
import argparse
import base64
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from supervision import etcd_argv, get, poll  # noqa: E402

IP = "127.77.0.5"


def b64(s):
    return base64.b64encode(s.encode()).decode()


def writer(n, stop, acked):
    i = 0
    while not stop.is_set():
        key = f"w{n:02d}-{i:08d}"
        body = json.dumps({"key": b64(key), "value": b64("x" * 200)}).encode()
        try:
            req = urllib.request.Request(f"http://{IP}:2379/v3/kv/put", data=body, method="POST")
            with urllib.request.urlopen(req, timeout=2) as r:
                r.read()
            acked.append((time.monotonic(), key))
            i += 1
        except OSError:
            return


def keys_in(etcd, data):
    p = subprocess.Popen(etcd_argv(etcd, IP, data), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        poll("restored etcd", lambda: get(f"http://{IP}:2379/health")[0] == 200, timeout=60, every=0.05)
        keys, start = set(), b64("w")
        while True:
            body = json.dumps({"key": start, "range_end": b64("x"), "keys_only": True, "limit": 100000}).encode()
            req = urllib.request.Request(f"http://{IP}:2379/v3/kv/range", data=body, method="POST")
            with urllib.request.urlopen(req, timeout=30) as r:
                resp = json.load(r)
            kvs = resp.get("kvs", [])
            keys.update(base64.b64decode(kv["key"]).decode() for kv in kvs)
            if not resp.get("more"):
                return keys
            start = b64(base64.b64decode(kvs[-1]["key"]).decode() + "\0")
    finally:
        p.kill()
        p.wait()


def round_(a, period, tmp, i):
    data, store = f"{tmp}/data{i}", f"file://{tmp}/store{i}"
    w = subprocess.Popen([a.warden, "run", "--listen", f"{IP}:2378", "--store", store,
                          "--delta-snapshot-period", period, "--", *etcd_argv(a.etcd, IP, data)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    poll("ready", lambda: get(f"http://{IP}:2378/readyz")[0] == 200, timeout=60, every=0.02)
    poll("first full", lambda: json.loads(get(f"http://{IP}:2378/status")[1])["backup"]["fulls_total"] >= 1,
         timeout=60, every=0.05)
    etcd_pid = json.loads(get(f"http://{IP}:2378/status")[1])["etcd"]["pid"]
    stop, acked = threading.Event(), []
    threads = [threading.Thread(target=writer, args=(n, stop, acked)) for n in range(8)]
    for t in threads:
        t.start()
    time.sleep(random.uniform(5, 15))
    t_kill = time.monotonic()
    for pid in (w.pid, etcd_pid):   # the host dies: both at once
        os.kill(pid, signal.SIGKILL)
    stop.set()
    for t in threads:
        t.join()
    w.wait()
    acked = [(t, k) for t, k in acked if t <= t_kill]
    restored_dir = f"{tmp}/restored{i}"
    subprocess.run([a.warden, "restore", "--store", store, "--data-dir", restored_dir, "--name", "b",
                    "--initial-cluster", f"b=http://{IP}:2380", "--initial-advertise-peer-urls", f"http://{IP}:2380",
                    "--etcd", a.etcd], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    have = keys_in(a.etcd, restored_dir)
    lost = [(t, k) for t, k in acked if k not in have]
    window = (t_kill - min(t for t, _ in lost)) if lost else 0.0
    rate = len(acked) / max(1e-9, acked[-1][0] - acked[0][0]) if len(acked) > 1 else 0
    return len(acked), len(lost), window, rate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--etcd", default=os.environ.get("ETCD35_BIN", "/usr/bin/etcd"))
    ap.add_argument("--warden", default="target/release/etcd-warden")
    ap.add_argument("--periods", default="1s,10s")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    print("RPO: warden and etcd SIGKILLed together under 8 writers, then restore from the store")
    print(f"{'period':>7} {'round':>5} {'acked':>7} {'lost':>6} {'lost window':>12} {'writes/s':>9} {'bound':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        n = 0
        for period in a.periods.split(","):
            secs = float(period.rstrip("s"))
            windows = []
            for r in range(a.rounds):
                acked, lost, window, rate = round_(a, period, tmp, n)
                n += 1
                bound = int(rate * (secs + 1))
                windows.append(window)
                ok = "ok" if lost <= bound else "OVER"
                print(f"{period:>7} {r:>5} {acked:>7} {lost:>6} {window:>11.2f}s {rate:>9.0f} {bound:>6} {ok}")
            print(f"{period:>7} median lost window {statistics.median(windows):.2f}s (bound {secs + 1:.0f}s)")


if __name__ == "__main__":
    main()
