#!/usr/bin/env python3
"""Supervision figures for etcd-warden, measured side by side in one run (issue: part 1).

  * idle cost: the warden's RSS and CPU over --idle seconds beside a real, idle etcd
    (etcd's own RSS and CPU over the same window, for scale)
  * run -> etcd spawned: from exec of `etcd-warden run` to etcd's process existing
  * run -> ready: to /readyz 200, against plain etcd (no warden) -> its own /health 200, A B A B
  * respawn after SIGKILL: from the kill to a new etcd process (backoff-min 10ms) and to ready again

Usage: bench/supervision.py [--etcd PATH] [--rounds N] [--idle SECONDS] [--warden PATH]
Prints one table; figures are medians over the rounds.
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

CLK = os.sysconf("SC_CLK_TCK")


def children(ppid):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        rest = s[s.rfind(")") + 2:].split()
        if int(rest[1]) == ppid and rest[0] != "Z":
            out.append(int(d))
    return out


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        s = f.read()
    rest = s[s.rfind(")") + 2:].split()
    return int(rest[11]) + int(rest[12])


def rss_kib(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def get(url, timeout=1.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return None, ""


def poll(what, f, timeout=30.0, every=0.0005):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = f()
        if v:
            return v
        time.sleep(every)
    raise SystemExit(f"timed out waiting for {what}")


def etcd_argv(etcd, ip, data):
    return [etcd, "--name", "b", "--data-dir", data,
            "--listen-client-urls", f"http://{ip}:2379", "--advertise-client-urls", f"http://{ip}:2379",
            "--listen-peer-urls", f"http://{ip}:2380", "--initial-advertise-peer-urls", f"http://{ip}:2380",
            "--initial-cluster", f"b=http://{ip}:2380", "--log-level", "error"]


def kill_tree(p, extra=()):
    for pid in extra:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        p.kill()
    except ProcessLookupError:
        pass
    p.wait()


def run_warden(warden, etcd, ip, data, extra=()):
    t0 = time.monotonic()
    p = subprocess.Popen([warden, "run", "--listen", f"{ip}:2378", *extra, "--", *etcd_argv(etcd, ip, data)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    child = poll("etcd to be spawned", lambda: children(p.pid))[0]
    t_spawn = time.monotonic() - t0
    poll("warden ready", lambda: get(f"http://{ip}:2378/readyz")[0] == 200, every=0.002)
    t_ready = time.monotonic() - t0
    return p, child, t_spawn, t_ready


def run_plain(etcd, ip, data):
    t0 = time.monotonic()
    p = subprocess.Popen(etcd_argv(etcd, ip, data), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    poll("plain etcd /health", lambda: get(f"http://{ip}:2379/health")[0] == 200, every=0.002)
    return p, time.monotonic() - t0


def ms(x):
    return f"{x * 1000:.1f} ms"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--etcd", default=os.environ.get("ETCD35_BIN", "/usr/bin/etcd"))
    ap.add_argument("--warden", default="target/release/etcd-warden")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--idle", type=float, default=60.0)
    a = ap.parse_args()
    ip = "127.77.0.1"
    spawn, ready_w, ready_p, respawn, reready, restart_p = [], [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.rounds):
            # A: warden + etcd, fresh data dir
            p, child, ts, tr = run_warden(a.warden, a.etcd, ip, f"{tmp}/w{i}", ["--restart-backoff-min", "10ms"])
            spawn.append(ts)
            ready_w.append(tr)
            t0 = time.monotonic()
            os.kill(child, signal.SIGKILL)
            new = poll("respawned etcd", lambda: [c for c in children(p.pid) if c != child])[0]
            respawn.append(time.monotonic() - t0)
            poll("ready again", lambda: get(f"http://{ip}:2378/readyz")[0] == 200, every=0.002)
            reready.append(time.monotonic() - t0)
            kill_tree(p, [new])
            # B: plain etcd restarted on that same data dir (what a respawn has to wait for anyway)
            q, tq = run_plain(a.etcd, ip, f"{tmp}/w{i}")
            restart_p.append(tq)
            kill_tree(q)
            # B: plain etcd, fresh data dir
            q, tp = run_plain(a.etcd, ip, f"{tmp}/p{i}")
            ready_p.append(tp)
            kill_tree(q)

        p, child, _, _ = run_warden(a.warden, a.etcd, ip, f"{tmp}/idle")
        time.sleep(2)
        w0, e0, t0 = cpu_ticks(p.pid), cpu_ticks(child), time.monotonic()
        time.sleep(a.idle)
        w1, e1, t1 = cpu_ticks(p.pid), cpu_ticks(child), time.monotonic()
        span = t1 - t0
        w_rss, w_hwm, e_rss = rss_kib(p.pid), rss_kib(p.pid, "VmHWM"), rss_kib(child)
        status = json.loads(get(f"http://{ip}:2378/status")[1])
        kill_tree(p, [child])

    med = statistics.median
    version = subprocess.run([a.etcd, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    size = os.path.getsize(a.warden)
    print(f"etcd-warden supervision benchmark  ({version}; {a.rounds} rounds, medians; idle window {span:.0f} s)")
    print(f"  binary size                         {size / 1048576:.1f} MiB ({a.warden})")
    print(f"  warden idle RSS / peak RSS           {w_rss / 1024:.1f} MiB / {w_hwm / 1024:.1f} MiB   (etcd beside it: {e_rss / 1024:.1f} MiB)")
    print(f"  warden idle CPU                      {100 * (w1 - w0) / CLK / span:.3f} % of a core   (etcd: {100 * (e1 - e0) / CLK / span:.3f} %)")
    print(f"  run -> etcd spawned                  {ms(med(spawn))}  (min {ms(min(spawn))}, max {ms(max(spawn))})")
    print(f"  run -> /readyz 200 (warden)          {ms(med(ready_w))}")
    print(f"  plain etcd -> /health 200            {ms(med(ready_p))}   ratio warden/plain {med(ready_w) / med(ready_p):.2f}x")
    print(f"  SIGKILL -> new etcd process          {ms(med(respawn))}  (backoff-min 10ms, jitter: 5-10 ms of it)")
    print(f"  SIGKILL -> /readyz 200 again         {ms(med(reready))}")
    print(f"  plain etcd restart, same data -> /health 200   {ms(med(restart_p))}   ratio {med(reready) / med(restart_p):.2f}x")
    print(f"  health checks ran: etcd revision {status['etcd']['revision']}, phase {status['phase']}")


if __name__ == "__main__":
    sys.exit(main())
