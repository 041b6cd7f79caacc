#!/usr/bin/env python3
"""Fencing latency (issue: part 4): from the moment the DNS answer changes to etcd's death.

A small DNS server on loopback answers the TXT record at the owner name; the warden checks it every
--interval. Each round: owner record = this host, wait until ready, write a key, then at a random
point of the check period flip the record to another host and time etcd's death exactly (a pidfd
becomes readable when the process is gone), then wait for the final snapshot. Also reported: from
the flip to the public client port refusing, and from the flip to the final snapshot in the store.

Usage: bench/fencing.py [--etcd PATH] [--warden PATH] [--flips N] [--interval 1s]
"""
import argparse
import json
import os
import random
import select
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from supervision import etcd_argv, get, poll  # noqa: E402

NAME = "_etcd-owner.bench.test"


class Dns:
    """Answers TXT queries for NAME with the current owner; NXDOMAIN for anything else."""

    def __init__(self, ip):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((ip, 0))
        self.addr = "%s:%d" % self.sock.getsockname()
        self.owner = "host-a"
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            data, peer = self.sock.recvfrom(1500)
            qid, _flags, qd = struct.unpack(">HHH", data[:6])
            i = 12
            labels = []
            while data[i]:
                labels.append(data[i + 1:i + 1 + data[i]].decode())
                i += 1 + data[i]
            question = data[12:i + 5]
            qtype = struct.unpack(">H", data[i + 1:i + 3])[0]
            name = ".".join(labels).lower()
            if name != NAME.lower():
                self.sock.sendto(struct.pack(">HHHHHH", qid, 0x8583, 1, 0, 0, 0) + question, peer)
                continue
            answers = b""
            count = 0
            if qtype == 16:
                value = self.owner.encode()
                rdata = bytes([len(value)]) + value
                answers = struct.pack(">HHHIH", 0xC00C, 16, 1, 0, len(rdata)) + rdata
                count = 1
            self.sock.sendto(struct.pack(">HHHHHH", qid, 0x8580, 1, count, 0, 0) + question + answers, peer)


def status(ip):
    code, body = get(f"http://{ip}:2378/status")
    return json.loads(body) if code == 200 else None


def refuses(ip):
    try:
        socket.create_connection((ip, 2379), timeout=0.2).close()
        return False
    except OSError:
        return True


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--etcd", default=os.environ.get("ETCD35_BIN", "/usr/bin/etcd"))
    ap.add_argument("--warden", default="target/release/etcd-warden")
    ap.add_argument("--flips", type=int, default=20)
    ap.add_argument("--interval", default="1s")
    a = ap.parse_args()
    interval_s = float(a.interval.rstrip("ms")) / (1000 if a.interval.endswith("ms") else 1)
    ip = "127.77.0.4"
    dns = Dns(ip)
    etcdctl = os.path.join(os.path.dirname(a.etcd), "etcdctl")
    deaths, refusals, finals = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        log = open(f"{tmp}/warden.log", "w")
        p = subprocess.Popen(
            [a.warden, "run", "--listen", f"{ip}:2378", "--store", f"file://{tmp}/store",
             "--owner-name", NAME, "--owner-id", "host-a", "--owner-check-interval", a.interval,
             "--owner-check-timeout", f"{int(min(500, interval_s * 500))}ms", "--owner-check-resolver", dns.addr,
             "--", *etcd_argv(a.etcd, ip, f"{tmp}/data")],
            stdout=log, stderr=log)
        try:
            for i in range(a.flips):
                dns.owner = "host-a"
                poll("ready", lambda: get(f"http://{ip}:2378/readyz")[0] == 200, timeout=60, every=0.005)
                subprocess.run([etcdctl, "--endpoints", f"http://{ip}:2379", "put", f"round-{i}", "x"],
                               check=True, stdout=subprocess.DEVNULL, env={**os.environ, "ETCDCTL_API": "3"})
                pid = status(ip)["etcd"]["pid"]
                fd = os.pidfd_open(pid)
                finals_before = status(ip)["ownership"]["fence"]["final_snapshots_total"]
                time.sleep(random.uniform(0, interval_s))
                t0 = time.monotonic()
                dns.owner = "host-b"
                select.select([fd], [], [], 30)
                deaths.append(time.monotonic() - t0)
                os.close(fd)
                poll("client port refusing", lambda: refuses(ip), every=0.001)
                refusals.append(time.monotonic() - t0)
                poll("final snapshot", lambda: (s := status(ip)) and
                     s["ownership"]["fence"]["final_snapshots_total"] > finals_before, timeout=60, every=0.01)
                finals.append(time.monotonic() - t0)
        except BaseException:
            log.flush()
            sys.stderr.write("".join(open(f"{tmp}/warden.log").readlines()[-30:]))
            raise
        finally:
            p.kill()
            p.wait()
    print(f"fencing over {a.flips} flips, --owner-check-interval {a.interval} (flip at a random point of the period)")
    print(f"{'':32} {'median':>9} {'p90':>9} {'max':>9}")
    for label, xs in [("flip -> etcd dead", deaths), ("flip -> client port refuses", refusals),
                      ("flip -> final snapshot stored", finals)]:
        print(f"{label:32} {statistics.median(xs)*1e3:8.1f}ms {pct(xs, 90)*1e3:8.1f}ms {max(xs)*1e3:8.1f}ms")
    over = max(deaths) - interval_s
    print(f"worst kill minus interval: {over*1e3:.1f} ms (goal <= 50 ms)")


if __name__ == "__main__":
    main()
