#!/usr/bin/env python3
"""Restore-drill benchmark: what `--verify-schedule` costs beside a live etcd of --mib MiB. The
drill restores the newest chain into a scratch dir beside the data dir, opens it with etcd and
compares its HashKV with the live etcd's at the same revision.

etcd alone is filled first (`fill`, Kubernetes-like objects); then a warden (file store) runs it
with a drill scheduled at a minute far enough ahead for its start and first full. A prober writes
one key every 10 ms; the figures are the drill's wall time (from its scheduled minute to its
verdict in /status), the warden's peak RSS during it, the disk the scratch dir took at most, and
the longest gap between two acknowledged writes during the drill against the same prober's longest
gap over as long a window just before it.

Usage: bench/drill.py --etcd PATH [--mib 1024] [--warden BINARY]
"""
import argparse
import base64
import datetime
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request

IP = "127.79.6.1"
WARDEN = "target/release/etcd-warden"


def poll(what, f, timeout=900, every=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = f()
        if v:
            return v
        time.sleep(every)
    raise SystemExit(f"timed out waiting for {what}")


def status():
    """The warden's /status; {"backup": {}} while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{IP}:2378/status", timeout=2) as r:
            return json.loads(r.read())
    except Exception:
        return {"backup": {}, "space": {}}


def put(n):
    body = json.dumps({"key": base64.b64encode(f"/probe/{n}".encode()).decode(), "value": "dg=="}).encode()
    req = urllib.request.Request(f"http://{IP}:2379/v3/kv/put", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        r.read()


def health():
    try:
        with urllib.request.urlopen(f"http://{IP}:2379/health", timeout=2) as r:
            return json.loads(r.read()).get("health") == "true"
    except Exception:
        return False


def prober(stop, acks):
    """One write every 10 ms; `acks` gets the time of each acknowledged one."""
    n = 0
    while not stop.is_set():
        try:
            put(n)
            acks.append(time.monotonic())
        except Exception:
            pass
        n += 1
        time.sleep(0.01)


def longest_gap(acks, t0, t1):
    window = [a for a in acks if t0 <= a <= t1]
    edges = [t0, *window, t1]
    return max(b - a for a, b in zip(edges, edges[1:]))


def vm(pid, field):
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(field + ":")) / 1024


def du(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--etcd", required=True)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--warden", default=WARDEN)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="bench-drill-")
    data = os.path.join(d, "data")
    argv = [a.etcd, "--name", "m0", "--data-dir", data,
            "--listen-client-urls", f"http://{IP}:2379", "--advertise-client-urls", f"http://{IP}:2379",
            "--listen-peer-urls", f"http://{IP}:2380", "--initial-advertise-peer-urls", f"http://{IP}:2380",
            "--initial-cluster", f"m0=http://{IP}:2380", "--quota-backend-bytes", str(8 << 30)]
    w = etcd = None
    stop = threading.Event()
    try:
        etcd = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        poll("etcd to answer", lambda: health())
        t0 = time.monotonic()
        subprocess.run(["target/release/examples/fill", f"http://{IP}:2379", str(a.mib)], check=True,
                       capture_output=True)
        print(f"drill: {a.mib} MiB written in {time.monotonic() - t0:.0f} s", flush=True)
        etcd.terminate()
        etcd.wait(timeout=120)
        # A warden on that data, the drill at the first minute at least 150 s away (start, first full).
        at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=150)
        at = (at + datetime.timedelta(minutes=1)).replace(second=0, microsecond=0)
        log = open(os.path.join(d, "warden.log"), "w")
        w = subprocess.Popen([a.warden, "run", "--listen", f"{IP}:2378", "--store", f"file://{d}/store",
                              "--delta-snapshot-period", "1s", "--verify-schedule", f"{at.minute} {at.hour} * * *",
                              "--", *argv], stdout=log, stderr=subprocess.STDOUT)
        poll("the warden ready", lambda: status().get("ready"))
        poll("the first full", lambda: (status()["backup"].get("fulls_total") or 0) >= 1)
        full = status()["backup"]["last_full"]
        db = status()["space"]["db_size"] >> 20
        print(f"drill: a {db} MiB database, its full {full['duration_seconds']:.1f} s; the drill at {at:%H:%M} UTC",
              flush=True)
        acks = []
        t = threading.Thread(target=prober, args=(stop, acks), daemon=True)
        t.start()
        start = at.timestamp() - time.time() + time.monotonic()
        if start - time.monotonic() < 20:
            raise SystemExit("the warden's start and first full left less than 20 s before the drill")
        poll("the drill's minute", lambda: time.monotonic() >= start - 2, every=0.5)
        with open(f"/proc/{w.pid}/clear_refs", "w") as f:
            f.write("5")  # resets the peak RSS (VmHWM) to the RSS now
        rss0 = vm(w.pid, "VmRSS")
        scratch, peak_disk = None, 0

        def done():
            nonlocal scratch, peak_disk
            if scratch is None:
                scratch = next((os.path.join(d, n) for n in os.listdir(d) if n.startswith("data.verify-")), None)
            if scratch:
                peak_disk = max(peak_disk, du(scratch))
            return ((status()["backup"].get("restore_drill") or {}).get("runs") or 0) >= 1

        poll("the drill's verdict", done, timeout=1800, every=0.5)
        took = time.monotonic() - start
        hwm = vm(w.pid, "VmHWM")
        time.sleep(1)
        stop.set()
        t.join()
        drill = status()["backup"]["restore_drill"]
        with open(os.path.join(d, "warden.log")) as f:
            said = [l.strip() for l in f if "restore drill" in l]
        assert not drill["last_error"], f"the drill failed: {drill['last_error']}"
        assert drill["matches_live"] is True, f"the drill's HashKV was not compared equal: {drill}; {said}"
        during = longest_gap(acks, start, start + took)
        before = longest_gap(acks, start - min(took, start - t_first(acks)), start)
        print(f"drill: {took:.1f} s to its verdict (the restore {drill['last_seconds']:.1f} s), revision "
              f"{drill['last_revision']}, HashKV equal to the live etcd's; warden peak RSS {hwm:.0f} MiB "
              f"(from {rss0:.0f}); scratch dir at most {peak_disk >> 20} MiB", flush=True)
        print(f"drill: longest write gap during it {during:.2f} s, over as long a window before it "
              f"{before:.2f} s ({len([x for x in acks if start <= x <= start + took])} writes acknowledged "
              f"during it)", flush=True)
    finally:
        stop.set()
        if etcd is not None and etcd.poll() is None:
            etcd.kill()
            etcd.wait()
        if w is not None:
            w.send_signal(signal.SIGTERM)
            try:
                w.wait(timeout=120)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
        shutil.rmtree(d, ignore_errors=True)


def t_first(acks):
    return acks[0] if acks else time.monotonic()


if __name__ == "__main__":
    main()
