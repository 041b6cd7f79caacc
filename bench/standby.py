#!/usr/bin/env python3
"""Warm standby benchmark: a standby following a copy store under write load, then promoted.

A primary warden (file store, `--copy-to` a second file store, 1 s delta period) runs etcd; `fill`
writes --mib MiB of Kubernetes-like objects and a full is taken. A standby (`etcd-warden standby`,
1 s poll) restores from the copy store (the first restore is timed), then follows it while `load`
writes --rate writes/s for --seconds; the standby's lag (seconds and revisions, from its /status)
is sampled every 200 ms and its peak RSS read from the kernel (VmHWM). Then the primary's warden
and etcd are SIGKILLed and `ctl promote --force` is timed to a ready etcd; the revision it serves
is checked against the primary's last one.

Usage: bench/standby.py --etcd PATH [--mib 1024] [--rate 1000] [--seconds 30]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request

PRIMARY, STANDBY = "127.79.6.1", "127.79.6.2"
WARDEN = "target/release/etcd-warden"


def poll(what, f, timeout=900):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = f()
        if v:
            return v
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def status(ip):
    try:
        with urllib.request.urlopen(f"http://{ip}:2378/status", timeout=2) as r:
            return json.loads(r.read())
    except Exception:
        return None


def revision(etcd, ip):
    out = subprocess.run([os.path.join(os.path.dirname(etcd), "etcdctl"), "--endpoints", f"http://{ip}:2379",
                          "endpoint", "status", "-w", "json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)[0]["Status"]["header"]["revision"]


def vm(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def etcd_argv(etcd, d, ip, name):
    return [etcd, "--name", name, "--data-dir", os.path.join(d, name),
            "--listen-client-urls", f"http://{ip}:2379", "--advertise-client-urls", f"http://{ip}:2379",
            "--listen-peer-urls", f"http://{ip}:2380", "--initial-advertise-peer-urls", f"http://{ip}:2380",
            "--initial-cluster", f"{name}=http://{ip}:2380", "--quota-backend-bytes", str(8 << 30)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--etcd", required=True)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=30)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="bench-standby-")
    store, copy = f"file://{d}/store", f"file://{d}/copy"
    plog = open(os.path.join(d, "primary.log"), "w")
    slog = open(os.path.join(d, "standby.log"), "w")
    primary = subprocess.Popen([WARDEN, "run", "--listen", f"{PRIMARY}:2378", "--store", store, "--copy-to", copy,
                                "--delta-snapshot-period", "1s", "--", *etcd_argv(a.etcd, d, PRIMARY, "primary")],
                               stdout=plog, stderr=subprocess.STDOUT)
    standby = None
    try:
        poll("the primary ready", lambda: (s := status(PRIMARY)) and s.get("ready"))
        subprocess.run(["target/release/examples/fill", f"http://{PRIMARY}:2379", str(a.mib),
                        "/registry/configmaps/bench/"], check=True, capture_output=True)
        fulls = status(PRIMARY)["backup"]["fulls_total"]
        primary.send_signal(signal.SIGUSR1)
        poll("a full of the filled database in the copy",
             lambda: (s := status(PRIMARY)) and s["backup"]["fulls_total"] > fulls
             and s["copies"][0]["lag_revisions"] == 0)
        db = status(PRIMARY)["space"]["db_size"] >> 20
        sock = os.path.join(d, "standby.sock")
        t0 = time.monotonic()
        standby = subprocess.Popen([WARDEN, "standby", "--listen", f"{STANDBY}:2378", "--store", copy,
                                    "--standby-poll", "1s", "--standby-quiet", "3s", "--admin-socket", sock,
                                    "--", *etcd_argv(a.etcd, d, STANDBY, "standby")],
                                   stdout=slog, stderr=subprocess.STDOUT)
        poll("the standby following", lambda: (s := status(STANDBY)) and s["standby"]["state"] == "following")
        restored = time.monotonic() - t0
        print(f"standby: {db} MiB database; first restore from the copy store {restored:.1f} s, "
              f"RSS peak {vm(standby.pid, 'VmHWM'):.0f} MiB", flush=True)
        load = subprocess.Popen(["target/release/examples/load", f"http://{PRIMARY}:2379", str(a.seconds), "32",
                                 str(a.rate)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # The primary's revision over time (etcd's own answer), and the standby's against it: its lag
        # is how long ago the primary first held a revision the standby does not.
        timeline, lags, behinds, delays, rss = [], [], [], [], []
        while load.poll() is None:
            now = time.monotonic()
            timeline.append((now, revision(a.etcd, PRIMARY)))
            s = status(STANDBY)
            if s:
                srev = s["standby"]["revision"]
                ahead = next((t for t, r in timeline if r > srev), None)
                lags.append(0.0 if ahead is None else now - ahead)
                behinds.append(timeline[-1][1] - srev)
                if s["standby"].get("apply_delay_seconds") is not None:
                    delays.append(s["standby"]["apply_delay_seconds"])
                rss.append(vm(standby.pid, "VmRSS"))
            time.sleep(0.1)
        lags.sort()
        delays.sort()
        q = lambda v, f: v[min(len(v) - 1, int(len(v) * f))]
        print(f"standby: {a.rate} writes/s for {a.seconds} s, 1 s period and poll ({len(lags)} samples): behind etcd "
              f"p50 {q(lags, 0.5):.2f} s, p99 {q(lags, 0.99):.2f} s, max {lags[-1]:.2f} s, max {max(behinds)} "
              f"revisions; apply delay p50 {q(delays, 0.5):.2f} s, max {delays[-1]:.2f} s; RSS while following "
              f"{max(rss):.0f} MiB (peak {vm(standby.pid, 'VmHWM'):.0f} MiB)", flush=True)
        last = revision(a.etcd, PRIMARY)
        pid = status(PRIMARY)["etcd"]["pid"]
        primary.send_signal(signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
        primary.wait()
        t0 = time.monotonic()
        out = subprocess.run([WARDEN, "ctl", "--admin-socket", sock, "promote", "--force"], capture_output=True,
                             text=True)
        took = time.monotonic() - t0
        if out.returncode != 0:
            raise SystemExit(f"promotion failed: {out.stderr}")
        s = status(STANDBY)
        served = revision(a.etcd, STANDBY)
        assert served > last, f"the promoted standby serves {served}, the primary had {last}"
        print(f"standby: promoted to a ready etcd in {s['standby']['promotion']['seconds']:.2f} s "
              f"(ctl returned after {took:.2f} s); backed-up revision {s['standby']['promotion']['backed_up_revision']} "
              f"of the primary's {last}; peak RSS {vm(standby.pid, 'VmHWM'):.0f} MiB", flush=True)
    finally:
        for p in (primary, standby):
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
