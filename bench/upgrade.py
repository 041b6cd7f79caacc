#!/usr/bin/env python3
"""Upgrade benchmark: what the rollback point costs when a newer etcd minor first starts.

A data dir of --mib MiB (Kubernetes-like objects, bench's `fill`) written by etcd 3.5.30, then the
warden started on it with 3.6.16 and a local file store: the time from the warden's start to
"rollback point uploaded" (the point's age when the new release starts) and to /readyz 200. Side
by side, an ordinary restart of 3.5.30 on a copy of the same data (the same WAL replay, no point),
and `etcdctl snapshot save` of the 3.5 data from a running 3.5.30 (the plain copy etcd itself would
make). Every round runs each once; medians.

Usage: bench/upgrade.py --etcd35 PATH --etcd36 PATH [--mib 512] [--rounds 3]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request

IP = "127.79.3.1"


def etcd_args(data):
    return ["--name", "m1", "--data-dir", data,
            "--listen-client-urls", f"http://{IP}:2379", "--advertise-client-urls", f"http://{IP}:2379",
            "--listen-peer-urls", f"http://{IP}:2380", "--initial-advertise-peer-urls", f"http://{IP}:2380",
            "--initial-cluster", f"m1=http://{IP}:2380"]


def poll(what, f, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = f()
        if v:
            return v
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def ready():
    try:
        return urllib.request.urlopen(f"http://{IP}:2378/readyz", timeout=1).status == 200
    except Exception:
        return False


def stop(p):
    p.terminate()
    p.wait(timeout=60)


def warden_start(etcd, data, store, log):
    """Seconds to 'rollback point uploaded' (None without one) and to /readyz 200."""
    t0 = time.monotonic()
    with open(log, "w") as f:
        p = subprocess.Popen(["target/release/etcd-warden", "run", "--listen", f"{IP}:2378",
                              "--store", f"file://{store}", "--", etcd, *etcd_args(data)],
                             stdout=f, stderr=subprocess.STDOUT)
    point = None
    try:
        while True:
            if point is None and "rollback point uploaded" in open(log).read():
                point = time.monotonic() - t0
            if ready():
                return point, time.monotonic() - t0
            if p.poll() is not None:
                raise SystemExit(f"the warden exited: {open(log).read()[-2000:]}")
            time.sleep(0.02)
    finally:
        stop(p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--etcd35", required=True)
    ap.add_argument("--etcd36", required=True)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    ctl35 = os.path.join(os.path.dirname(a.etcd35), "etcdctl")
    tmp = tempfile.mkdtemp(prefix="bench-upgrade-")
    try:
        base = os.path.join(tmp, "base35")
        e = subprocess.Popen([a.etcd35, *etcd_args(base)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        poll("etcd 3.5 for the fill", lambda: subprocess.run(
            [ctl35, f"--endpoints=http://{IP}:2379", "endpoint", "health"], capture_output=True).returncode == 0)
        subprocess.run(["target/release/examples/fill", f"http://{IP}:2379", str(a.mib)], check=True, capture_output=True)
        stop(e)
        db = os.path.getsize(os.path.join(base, "member", "snap", "db")) / 2**20
        with_point, points, without, saves = [], [], [], []
        for r in range(a.rounds):
            d = os.path.join(tmp, f"up{r}")
            shutil.copytree(base, d)
            point, ready_s = warden_start(a.etcd36, d, os.path.join(tmp, f"store{r}"), os.path.join(tmp, f"up{r}.log"))
            if point is None:
                raise SystemExit("no rollback point was taken")
            points.append(point)
            with_point.append(ready_s)
            d2 = os.path.join(tmp, f"again{r}")
            shutil.copytree(base, d2)
            _, ready2 = warden_start(a.etcd35, d2, os.path.join(tmp, f"store-again{r}"), os.path.join(tmp, f"again{r}.log"))
            without.append(ready2)
            # etcd's own copy of the 3.5 data, from a running 3.5.30.
            d3 = os.path.join(tmp, f"save{r}")
            shutil.copytree(base, d3)
            e = subprocess.Popen([a.etcd35, *etcd_args(d3)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            poll("etcd 3.5", lambda: subprocess.run(
                [ctl35, f"--endpoints=http://{IP}:2379", "endpoint", "health"], capture_output=True).returncode == 0)
            t0 = time.monotonic()
            subprocess.run([ctl35, f"--endpoints=http://{IP}:2379", "snapshot", "save", os.path.join(tmp, f"s{r}.db")],
                           check=True, capture_output=True)
            saves.append(time.monotonic() - t0)
            stop(e)
            for x in (d, d2, d3):
                shutil.rmtree(x, ignore_errors=True)
        m = statistics.median
        print(f"upgrade 3.5.30 -> 3.6.16, db {db:.0f} MiB, {a.rounds} rounds (medians):")
        print(f"  rollback point uploaded (its age when 3.6 starts): {m(points):.2f} s after the warden's start")
        print(f"  ready with the rollback point:    {m(with_point):.2f} s")
        print(f"  ready on a plain 3.5.30 restart:  {m(without):.2f} s (same data, no point)")
        print(f"  etcdctl snapshot save of the 3.5 data (etcd's own copy): {m(saves):.2f} s")
        print(f"  the point costs {m(with_point) - m(without):.2f} s at start; "
              f"{m(points) / m(saves):.2f}x etcdctl's local save, and it is compressed and stored")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
