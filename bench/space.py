#!/usr/bin/env python3
"""Defragmentation benchmark: how long a three-member cluster refuses writes while its members
are defragmented, the space keeper's way (followers one at a time, leadership moved, the old
leader last) against all members at once (`etcdctl defrag` sent to the three together).

Each mode gets a fresh cluster under wardens (file store): --live-mib MiB of Kubernetes-like
objects kept (what a defragmentation copies) and --free-mib MiB written, deleted and compacted
(free pages). A prober writes one key every 10 ms through etcd's JSON gateway, trying each member
in turn (a client with all three endpoints); the figure is the longest gap between two acknowledged
writes while the defragmentation runs, and the defragmentation's wall time.

Usage: bench/space.py --etcd PATH [--live-mib 256] [--free-mib 256] [--modes keeper,all]
(`--modes keeper` skips the all-at-once comparison, for sizes where one cluster's fill is long)
"""
import argparse
import base64
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request

IPS = ["127.79.4.1", "127.79.4.2", "127.79.4.3"]
WARDEN = "target/release/etcd-warden"


def poll(what, f, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = f()
        if v:
            return v
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def gateway(ip, path, body, timeout):
    req = urllib.request.Request(f"http://{ip}:2379{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def b64(s):
    return base64.b64encode(s.encode()).decode()


def status(ip):
    try:
        with urllib.request.urlopen(f"http://{ip}:2378/status", timeout=2) as r:
            return json.loads(r.read())
    except Exception:
        return None


def ctl(etcd, ip, *args):
    return subprocess.run([os.path.join(os.path.dirname(etcd), "etcdctl"),
                           "--endpoints", f"http://{ip}:2379", *args],
                          check=True, capture_output=True, text=True).stdout


def start_cluster(etcd, d, keeper):
    cluster = ",".join(f"m{i}=http://{ip}:2380" for i, ip in enumerate(IPS))
    procs = []
    for i, ip in enumerate(IPS):
        log = open(os.path.join(d, f"warden{i}.log"), "w")
        opts = ["--listen", f"{ip}:2378", "--store", f"file://{d}/store",
                "--space-keeper", "on" if keeper else "off", "--space-defrag-free-min", "32MiB",
                "--space-defrag-free-ratio", "0.3"]
        argv = [etcd, "--name", f"m{i}", "--data-dir", os.path.join(d, f"m{i}"),
                "--listen-client-urls", f"http://{ip}:2379", "--advertise-client-urls", f"http://{ip}:2379",
                "--listen-peer-urls", f"http://{ip}:2380", "--initial-advertise-peer-urls", f"http://{ip}:2380",
                "--initial-cluster", cluster, "--initial-cluster-token", "bench-space",
                "--initial-cluster-state", "new", "--quota-backend-bytes", str(8 << 30)]
        procs.append(subprocess.Popen([WARDEN, "run", *opts, "--", *argv], stdout=log, stderr=subprocess.STDOUT))
    print(f"space: cluster in {d} (space keeper {'on' if keeper else 'off'})", flush=True)
    for ip in IPS:
        poll(f"{ip} ready", lambda: (s := status(ip)) and s.get("ready"))
    return procs


def prober(stop, record):
    """One write every 10 ms; `record` gets the time of each acknowledged write."""
    n = 0
    turn = 0
    while not stop.is_set():
        for k in range(3):
            ip = IPS[(turn + k) % 3]
            try:
                gateway(ip, "/v3/kv/put", {"key": b64(f"probe-{n}"), "value": b64("v")}, 0.3)
                record.append(time.monotonic())
                break
            except Exception:
                turn += 1
        n += 1
        time.sleep(0.01)


def fragment(etcd, live, free):
    fill = "target/release/examples/fill"
    subprocess.run([fill, f"http://{IPS[0]}:2379", str(live), "/live/"], check=True, capture_output=True)
    subprocess.run([fill, f"http://{IPS[0]}:2379", str(free), "/free/"], check=True, capture_output=True)
    # Gigabytes take longer than etcdctl's default 5 s to delete and to compact.
    ctl(etcd, IPS[0], "del", "/free/", "--prefix", "--command-timeout", "600s")
    rev = json.loads(ctl(etcd, IPS[0], "endpoint", "status", "-w", "json"))[0]["Status"]["header"]["revision"]
    ctl(etcd, IPS[0], "compact", str(rev), "--physical", "--command-timeout", "600s")


def db_sizes():
    out = []
    for ip in IPS:
        s = status(ip) or {}
        out.append((s.get("space") or {}).get("db_size"))
    return out


def run_mode(etcd, keeper, live, free):
    d = tempfile.mkdtemp(prefix="bench-space-")
    procs = start_cluster(etcd, d, keeper)
    try:
        fragment(etcd, live, free)
        stop = threading.Event()
        acks = []
        t = threading.Thread(target=prober, args=(stop, acks))
        t.start()
        time.sleep(1)
        t0 = time.monotonic()
        if keeper:
            # The writer's keeper sees free pages above half the file and starts a round.
            def round_done():
                logs = [open(os.path.join(d, f"warden{i}.log")).read() for i in range(3)]
                return any("defragmentation done" in log for log in logs)
            poll("the space keeper's defragmentation round", round_done, timeout=600)
        else:
            threads = [threading.Thread(target=ctl, args=(etcd, ip, "defrag", "--command-timeout", "600s"))
                       for ip in IPS]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
        t1 = time.monotonic()
        time.sleep(1)
        stop.set()
        t.join()
        window = [a for a in acks if t0 - 1 <= a <= t1 + 1]
        gaps = [b - a for a, b in zip(window, window[1:])]
        return max(gaps) if gaps else float("inf"), t1 - t0, db_sizes()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=60)
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--etcd", required=True)
    ap.add_argument("--live-mib", type=int, default=256)
    ap.add_argument("--free-mib", type=int, default=256)
    ap.add_argument("--modes", default="keeper,all")
    a = ap.parse_args()
    modes = a.modes.split(",")
    res = {m: run_mode(a.etcd, m == "keeper", a.live_mib, a.free_mib) for m in ("keeper", "all") if m in modes}
    print(f"space: {a.live_mib} MiB live + {a.free_mib} MiB free pages on three members")
    if "keeper" in res:
        one, one_wall, one_sizes = res["keeper"]
        print(f"  space keeper (one at a time, leader last): longest write gap {one:.2f} s, round {one_wall:.1f} s, db sizes after {one_sizes}")
    if "all" in res:
        all_, all_wall, all_sizes = res["all"]
        print(f"  all three at once (etcdctl defrag x3):     longest write gap {all_:.2f} s, round {all_wall:.1f} s, db sizes after {all_sizes}")
    if len(res) == 2 and res["keeper"][0] > 0:
        print(f"  ratio (all at once / keeper): {res['all'][0] / res['keeper'][0]:.1f}x")


if __name__ == "__main__":
    main()
