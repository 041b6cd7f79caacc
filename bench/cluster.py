#!/usr/bin/env python3
"""Cluster figures for etcd-warden (clusters part 1): three members on loopback, a release warden
each, one local file store, writes through a follower at --rate per second.

  * each member's warden RSS and peak RSS (writer and followers) after --seconds of writes
  * handover: the leader's etcd and warden SIGKILLed together -> a new writer -> its first delta,
    and how many acknowledged writes the store lacked at that first delta (read from the store's
    own objects with `backups list`: the newest backed-up revision against the last acknowledged one)

Usage: bench/cluster.py [--etcd PATH] [--warden PATH] [--seconds N] [--rate N] [--rounds N]
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time

from supervision import get, poll, rss_kib


def member_argv(etcd, ips, i, data):
    cluster = ",".join(f"m{j}=http://{ip}:2380" for j, ip in enumerate(ips))
    ip = ips[i]
    return [etcd, "--name", f"m{i}", "--data-dir", data,
            "--listen-client-urls", f"http://{ip}:2379", "--advertise-client-urls", f"http://{ip}:2379",
            "--listen-peer-urls", f"http://{ip}:2380", "--initial-advertise-peer-urls", f"http://{ip}:2380",
            "--initial-cluster", cluster, "--initial-cluster-token", "bench-cluster",
            "--initial-cluster-state", "new", "--log-level", "error"]


def status(ip):
    code, body = get(f"http://{ip}:2378/status")
    return json.loads(body) if code == 200 else {}


def etcd_pid(ip):
    return status(ip).get("etcd", {}).get("pid")


def role(ip):
    return status(ip).get("backup", {}).get("role")


def writer_loop(etcdctl, ip, rate, stop, acked):
    """Puts through etcdctl at `rate` per second (a batch per 100 ms); records the acknowledged revisions."""
    n = 0
    every = 0.1
    per = max(1, rate // 10)
    while not stop.is_set():
        t = time.monotonic()
        lines = "".join(f"put b{n + k:07d} v\n" for k in range(per))
        r = subprocess.run([etcdctl, "--endpoints", f"http://{ip}:2379", "txn", "-w", "json"],
                           input="\n" + lines + "\n\n", capture_output=True, text=True)
        if r.returncode == 0:
            acked.append(json.loads(r.stdout)["header"]["revision"])
        n += per
        time.sleep(max(0.0, every - (time.monotonic() - t)))


def one_round(args, round_no):
    etcdctl = os.path.join(os.path.dirname(args.etcd), "etcdctl")
    ips = [f"127.{60 + round_no}.0.{i + 1}" for i in range(3)]
    with tempfile.TemporaryDirectory() as tmp:
        store = f"file://{tmp}/store"
        procs = [subprocess.Popen([args.warden, "run", "--listen", f"{ip}:2378", "--store", store,
                                   "--delta-snapshot-period", args.period, "--",
                                   *member_argv(args.etcd, ips, i, f"{tmp}/m{i}")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for i, ip in enumerate(ips)]
        try:
            for ip in ips:
                poll(f"{ip} ready", lambda ip=ip: get(f"http://{ip}:2378/readyz")[0] == 200, timeout=60)
            first = poll("one writer", lambda: [i for i, ip in enumerate(ips) if role(ip) == "writer"], timeout=60)[0]
            poll("the first full", lambda: status(ips[first]).get("backup", {}).get("fulls_total", 0) >= 1, timeout=60)
            via = (first + 1) % 3
            stop, acked = threading.Event(), []
            t = threading.Thread(target=writer_loop, args=(etcdctl, ips[via], args.rate, stop, acked))
            t.start()
            time.sleep(args.seconds)
            rss = [(i, "writer" if i == first else "follower", rss_kib(p.pid), rss_kib(p.pid, "VmHWM"))
                   for i, p in enumerate(procs)]
            dead_etcd = etcd_pid(ips[first])
            killed = time.monotonic()
            procs[first].send_signal(signal.SIGKILL)
            os.kill(dead_etcd, signal.SIGKILL)
            procs[first].wait()
            live = [i for i in range(3) if i != first]
            second = poll("a new writer", lambda: [i for i in live if role(ips[i]) == "writer"], timeout=60)[0]
            new_writer = time.monotonic() - killed
            before = status(ips[second])["backup"].get("deltas_total", 0)
            acked_at_kill = acked[-1] if acked else 0
            poll("the new writer's first delta",
                 lambda: status(ips[second])["backup"].get("deltas_total", 0) > before, timeout=60, every=0.01)
            first_delta = time.monotonic() - killed
            backed = status(ips[second])["backup"].get("backed_up_revision") or 0
            stop.set()
            t.join()
            return rss, new_writer, first_delta, max(0, acked_at_kill - backed)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--etcd", default="etcd")
    ap.add_argument("--warden", default="target/release/etcd-warden")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--period", default="1s")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = [one_round(args, r) for r in range(args.rounds)]
    print(f"cluster: 3 members, {args.rate} writes/s for {args.seconds:.0f} s, delta period {args.period}, "
          f"{args.rounds} rounds (medians)")
    w = [r for rss, *_ in rows for r in rss if r[1] == "writer"]
    f = [r for rss, *_ in rows for r in rss if r[1] == "follower"]
    print(f"  writer's warden RSS / peak       {statistics.median(r[2] for r in w) / 1024:.1f} MiB / "
          f"{statistics.median(r[3] for r in w) / 1024:.1f} MiB")
    print(f"  a follower's warden RSS / peak   {statistics.median(r[2] for r in f) / 1024:.1f} MiB / "
          f"{statistics.median(r[3] for r in f) / 1024:.1f} MiB")
    print(f"  leader killed -> new writer      {statistics.median(r[1] for r in rows):.2f} s "
          f"(rounds: {', '.join(f'{r[1]:.2f}' for r in rows)})")
    print(f"  leader killed -> its first delta {statistics.median(r[2] for r in rows):.2f} s "
          f"(rounds: {', '.join(f'{r[2]:.2f}' for r in rows)})")
    print(f"  acknowledged revisions the store lacked at that delta: "
          f"{', '.join(str(r[3]) for r in rows)}")


if __name__ == "__main__":
    main()
