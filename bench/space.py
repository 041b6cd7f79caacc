#!/usr/bin/env python3
"""Defragmentation benchmark: how long a three-member cluster refuses writes while its members
are defragmented, the space keeper's way (followers one at a time, leadership moved, the old
leader last) against all members at once (`etcdctl defrag` sent to the three together).

Each mode gets a fresh cluster under wardens (file store): --live-mib MiB of Kubernetes-like
objects kept (what a defragmentation copies) and --free-mib MiB written, deleted and compacted
(free pages). A prober writes one key every 10 ms through etcd's JSON gateway, trying each member
in turn (a client with all three endpoints); the figure is the longest gap between two acknowledged
writes from the first member's defragmentation to the last one's end, as etcd logs them (each
member must log one), and that span's length.

Usage: bench/space.py --etcd PATH [--live-mib 256] [--free-mib 256] [--modes keeper,all]
(`--modes keeper` skips the all-at-once comparison, for sizes where one cluster's fill is long)
"""
import argparse
import base64
import datetime
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


def poll(what, f, timeout=300, every=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = f()
        if v:
            return v
        time.sleep(every)
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
    """One write every 10 ms; `record` gets the (wall clock) time of each acknowledged write."""
    n = 0
    turn = 0
    while not stop.is_set():
        for k in range(3):
            ip = IPS[(turn + k) % 3]
            try:
                gateway(ip, "/v3/kv/put", {"key": b64(f"probe-{n}"), "value": b64("v")}, 0.3)
                record.append(time.time())
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


def db_sizes(etcd):
    """Each member's db size in MiB, as etcd reports it; None from a member that does not answer
    (etcd answers nothing while it defragments)."""
    def size(ip):
        try:
            return json.loads(ctl(etcd, ip, "endpoint", "status", "-w", "json"))[0]["Status"]["dbSize"] >> 20
        except subprocess.CalledProcessError:
            return None
    return [size(ip) for ip in IPS]


def logged(d, i, msg):
    """The times (epoch seconds) of member i's etcd log lines with this message."""
    out = []
    with open(os.path.join(d, f"warden{i}.log")) as f:
        for line in f:
            if f'"msg":"{msg}"' in line:
                try:
                    ts = json.loads(line)["ts"]
                    out.append(datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp())
                except (ValueError, KeyError):
                    continue
    return out


def defrags(d, since):
    """Each member's (start, end) of its last defragmentation begun after `since`, or None."""
    out = []
    for i in range(3):
        starts = [t for t in logged(d, i, "starting defragment") if t >= since]
        ends = [t for t in logged(d, i, "finished defragment") if starts and t >= starts[-1]]
        out.append((starts[-1], ends[0]) if starts and ends else None)
    return out


def run_mode(etcd, keeper, live, free):
    d = tempfile.mkdtemp(prefix="bench-space-")
    stop = threading.Event()
    procs = start_cluster(etcd, d, keeper)
    try:
        before = db_sizes(etcd)
        # The prober runs from before the compaction: the keeper may start its round at once.
        acks = []
        t = threading.Thread(target=prober, args=(stop, acks), daemon=True)
        t.start()
        since = time.time()
        fragment(etcd, live, free)
        fragmented = db_sizes(etcd)
        if keeper:
            # The writer's keeper sees the free pages and starts a round: every member's etcd
            # logs a defragmentation begun after the compaction.
            runs = poll("every member's defragmentation by the space keeper",
                        lambda: (r := defrags(d, since)) and all(r) and r, timeout=1800, every=1)
        else:
            threads = [threading.Thread(target=ctl, args=(etcd, ip, "defrag", "--command-timeout", "600s"))
                       for ip in IPS]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            runs = defrags(d, since)
        time.sleep(1)
        stop.set()
        t.join()
        assert all(runs), f"a member logged no defragmentation: {runs}"
        t0, t1 = min(r[0] for r in runs), max(r[1] for r in runs)
        edges = [t0, *[a for a in acks if t0 <= a <= t1], t1]
        gap = max(b - a for a, b in zip(edges, edges[1:]))
        each = ", ".join(f"m{i} {e - s:.1f} s" for i, (s, e) in enumerate(runs))
        return gap, t1 - t0, f"db MiB {before} -> {fragmented} -> {db_sizes(etcd)}; each defragmentation {each}"
    finally:
        stop.set()
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
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
        print(f"  space keeper (one at a time, leader last): longest write gap {one:.2f} s, span {one_wall:.1f} s, {one_sizes}")
    if "all" in res:
        all_, all_wall, all_sizes = res["all"]
        print(f"  all three at once (etcdctl defrag x3):     longest write gap {all_:.2f} s, span {all_wall:.1f} s, {all_sizes}")
    if len(res) == 2 and res["keeper"][0] > 0:
        print(f"  ratio (all at once / keeper): {res['all'][0] / res['keeper'][0]:.1f}x")


if __name__ == "__main__":
    main()
