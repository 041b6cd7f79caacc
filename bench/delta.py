#!/usr/bin/env python3
"""Delta capture under write load: a warden with a local file store beside a loaded etcd.

For each target rate (writes/s; 0 = as fast as etcd takes them): run the load for --seconds,
then report the writes/s etcd accepted, whether every revision reached the store (backed_up_revision
== etcd's revision), how long after the load stopped the store caught up (lag), the warden's peak RSS
(VmHWM) against --delta-snapshot-max-bytes, and the delta objects written.

--fill-mib N adds a row of a write burst: `examples/fill` writing N MiB of Kubernetes-like objects of
~4 KiB as fast as etcd takes them (what a restore test or a migration does), the buffer reaching its
bound at every flush. --compare BINARY runs every row with that build too, side by side.

Usage: bench/delta.py --etcd PATH [--rates 1000,10000,0] [--seconds 20] [--fill-mib 1024]
       [--compare BINARY]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

IP = "127.80.0.1"


def get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def poll(what, f, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = f()
        if v:
            return v
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def etcd_revision(ctl):
    """etcd's own answer (`etcdctl endpoint status`), not the warden's view of it."""
    p = subprocess.run([ctl, f"--endpoints=http://{IP}:2379", "endpoint", "status", "-w", "json"],
                       env=dict(os.environ, ETCDCTL_API="3"), capture_output=True, text=True, check=True)
    return json.loads(p.stdout)[0]["Status"]["header"]["revision"]


def vm(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--etcd", required=True)
    ap.add_argument("--warden", default="target/release/etcd-warden")
    ap.add_argument("--load", default="target/release/examples/load")
    ap.add_argument("--rates", default="1000,10000,0")
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--max-bytes", default="32MiB")
    ap.add_argument("--fill-mib", type=int, default=0)
    ap.add_argument("--fill", default="target/release/examples/fill")
    ap.add_argument("--compare", help="another etcd-warden build, run the same rows")
    a = ap.parse_args()
    ctl = os.path.join(os.path.dirname(a.etcd), "etcdctl")
    rows = []
    cases = [int(r) for r in a.rates.split(",") if r != ""] + (["fill"] if a.fill_mib else [])
    builds = [a.warden] + ([a.compare] if a.compare else [])
    for rate, warden in [(r, b) for r in cases for b in builds]:
        tmp = tempfile.mkdtemp(prefix="warden-delta-", dir="/var/tmp")
        store = os.path.join(tmp, "store")
        w = subprocess.Popen([warden, "run", "--listen", f"{IP}:2378", "--store", f"file://{store}",
                              "--delta-snapshot-period", "1s", "--delta-snapshot-max-bytes", a.max_bytes, "--",
                              a.etcd, "--name", "d", "--data-dir", os.path.join(tmp, "data"),
                              "--listen-client-urls", f"http://{IP}:2379", "--advertise-client-urls", f"http://{IP}:2379",
                              "--listen-peer-urls", f"http://{IP}:2380", "--initial-advertise-peer-urls", f"http://{IP}:2380",
                              "--initial-cluster", f"d=http://{IP}:2380", "--log-level", "error",
                              "--quota-backend-bytes", str(8 << 30)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, RUST_LOG="warn"))
        try:
            poll("ready", lambda: get(f"http://{IP}:2378/readyz").startswith("ready") if _ok(f"http://{IP}:2378/readyz") else False)
            poll("first full snapshot", lambda: json.loads(get(f"http://{IP}:2378/status"))["backup"]["fulls_total"] >= 1)
            if rate == "fill":
                t0 = time.monotonic()
                subprocess.run([a.fill, f"http://{IP}:2379", str(a.fill_mib), "/registry/configmaps/bench/"],
                               capture_output=True, check=True)
                out = f"{a.fill_mib} MiB of ~4 KiB objects in {time.monotonic() - t0:.1f} s"
            else:
                out = subprocess.run([a.load, f"http://{IP}:2379", str(a.seconds), "32", str(rate)],
                                     capture_output=True, text=True, check=True).stdout.strip()
            t_end = time.monotonic()
            # Every write the load saw acknowledged is at or below etcd's revision now.
            target = etcd_revision(ctl)

            def caught_up():
                b = json.loads(get(f"http://{IP}:2378/status"))["backup"]["backed_up_revision"]
                return b is not None and b >= target
            poll("the store to catch up", caught_up)
            lag = time.monotonic() - t_end
            hwm = vm(w.pid, "VmHWM")
            deltas = sum(len(fs) for dp, _, fs in os.walk(os.path.join(store, "v1", "delta")))
            verify = subprocess.run([warden, "backups", "verify", "--store", f"file://{store}"], capture_output=True, text=True)
            rows.append((rate, warden, out, lag, hwm, deltas, verify.returncode == 0))
        finally:
            w.terminate()
            w.wait()
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"delta capture benchmark ({a.seconds} s of load per row, 32 clients, ~1 KiB values, 10 % deletes; "
          f"period 1s, max-bytes {a.max_bytes})")
    print(f"{'target':>8}  {'achieved':<40} {'caught up after':>16} {'warden peak RSS':>16} {'deltas':>7} {'verify':>7}  build")
    for rate, warden, out, lag, hwm, deltas, ok in rows:
        target = rate if rate == "fill" else (f"{rate}/s" if rate else "max")
        print(f"{target:>8}  {out:<40} {lag:14.2f}s {hwm:13.1f}MiB {deltas:>7} {'ok' if ok else 'FAIL':>7}  {warden}")


def _ok(url):
    try:
        get(url)
        return True
    except Exception:
        return False


if __name__ == "__main__":
    sys.exit(main())
