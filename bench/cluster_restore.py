#!/usr/bin/env python3
"""Quorum-loss recovery: a three-member cluster (a release warden each, a local file store) holding
--mib of Kubernetes-like values loses all three data dirs; `etcd-warden cluster restore` is timed to
three ready members, against `etcdutl snapshot restore` of a snapshot of the same DB run three times
in a row (what an operator's runbook does, before even starting etcd). The restored members' HashKV
is checked equal.

Usage: bench/cluster_restore.py --etcd PATH [--warden PATH] [--mib 1024]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from supervision import get, poll

IPS = ["127.82.0.1", "127.82.0.2", "127.82.0.3"]


def argv(etcd, i, data):
    cluster = ",".join(f"m{j}=http://{ip}:2380" for j, ip in enumerate(IPS))
    ip = IPS[i]
    return [etcd, "--name", f"m{i}", "--data-dir", data, "--listen-client-urls", f"http://{ip}:2379",
            "--advertise-client-urls", f"http://{ip}:2379", "--listen-peer-urls", f"http://{ip}:2380",
            "--initial-advertise-peer-urls", f"http://{ip}:2380", "--initial-cluster", cluster,
            "--initial-cluster-token", "bench-restore", "--initial-cluster-state", "new",
            "--quota-backend-bytes", str(8 << 30), "--log-level", "error"]


def status(i):
    code, body = get(f"http://{IPS[i]}:2378/status", timeout=2)
    return json.loads(body) if code == 200 else {}


def start(a, tmp, store):
    procs = [subprocess.Popen([a.warden, "run", "--listen", f"{ip}:2378", "--store", store,
                              "--delta-snapshot-period", "1s", "--", *argv(a.etcd, i, f"{tmp}/m{i}")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, RUST_LOG="warn"))
             for i, ip in enumerate(IPS)]
    RUNNING[:] = procs
    return procs


def stop(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


RUNNING = []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--etcd", required=True)
    ap.add_argument("--warden", default="target/release/etcd-warden")
    ap.add_argument("--mib", type=int, default=1024)
    a = ap.parse_args()
    bindir = os.path.dirname(a.etcd)
    ctl, utl = os.path.join(bindir, "etcdctl"), os.path.join(bindir, "etcdutl")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP", "/var/tmp")) as tmp:
        store = f"file://{tmp}/store"
        procs = start(a, tmp, store)
        for i in range(3):
            poll(f"m{i} ready", lambda i=i: get(f"http://{IPS[i]}:2378/readyz")[0] == 200, timeout=120)
        w = poll("a writer", lambda: [i for i in range(3) if status(i).get("backup", {}).get("role") == "writer"], timeout=60)[0]
        print(subprocess.run(["target/release/examples/fill", f"http://{IPS[w]}:2379", str(a.mib)],
                             capture_output=True, text=True, check=True).stdout.strip(), file=sys.stderr)
        fulls = status(w)["backup"]["fulls_total"]
        os.kill(procs[w].pid, signal.SIGUSR1)
        poll("the full after the fill", lambda: status(w)["backup"].get("fulls_total", 0) > fulls, timeout=1800)
        rev = status(w)["etcd"]["revision"]
        poll("the store at etcd's revision", lambda: (status(w)["backup"].get("backed_up_revision") or 0) >= rev, timeout=600)
        snap = f"{tmp}/snap.db"
        subprocess.run([ctl, f"--endpoints=http://{IPS[w]}:2379", "snapshot", "save", snap],
                       env=dict(os.environ, ETCDCTL_API="3"), capture_output=True, check=True)
        stop(procs)
        for i in range(3):
            shutil.rmtree(f"{tmp}/m{i}")
        # etcdutl, three times in a row: what each member's runbook step costs, before etcd starts.
        t = time.monotonic()
        cluster = ",".join(f"m{j}=http://{ip}:2380" for j, ip in enumerate(IPS))
        for i in range(3):
            subprocess.run([utl, "snapshot", "restore", snap, "--data-dir", f"{tmp}/utl{i}", "--name", f"m{i}",
                            "--initial-cluster", cluster, "--initial-advertise-peer-urls", f"http://{IPS[i]}:2380",
                            "--initial-cluster-token", "bench-utl"], capture_output=True, check=True)
        t_utl = time.monotonic() - t
        for i in range(3):
            shutil.rmtree(f"{tmp}/utl{i}")
        procs = start(a, tmp, store)
        for i in range(3):
            poll(f"m{i} to say quorum lost",
                 lambda i=i: "quorum lost" in get(f"http://{IPS[i]}:2378/readyz")[1], timeout=120)
        t = time.monotonic()
        subprocess.run([a.warden, "cluster", "restore", "--store", store, "--bump-revision", "0"], capture_output=True, check=True)
        for i in range(3):
            poll(f"m{i} ready after the cluster restore",
                 lambda i=i: get(f"http://{IPS[i]}:2378/readyz")[0] == 200, timeout=1800, every=0.05)
        t_warden = time.monotonic() - t
        hashes = set()
        for ip in IPS:
            out = subprocess.run([ctl, f"--endpoints=http://{ip}:2379", "endpoint", "hashkv", "-w", "json"],
                                 capture_output=True, text=True, check=True).stdout
            hashes.add(json.loads(out)[0]["HashKV"]["hash"])
        stop(procs)
        size = os.path.getsize(snap) >> 20
        print(f"cluster restore, 3 members, {size} MiB DB at revision {rev}:")
        print(f"  `cluster restore` -> three ready members   {t_warden:.1f} s")
        print(f"  etcdutl snapshot restore x3 (no etcd start) {t_utl:.1f} s   ratio {t_warden / t_utl:.2f}x")
        print(f"  HashKV equal on all three: {len(hashes) == 1}")


if __name__ == "__main__":
    try:
        main()
    finally:
        stop(RUNNING)
