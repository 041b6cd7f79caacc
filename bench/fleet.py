#!/usr/bin/env python3
"""Fleet cost: store requests by kind for a three-member cluster on moto's S3 server, counted from
moto's own request log (one line per HTTP request), over --minutes of a quiet cluster (--rate 0: no
writes) or a busy one (--rate N writes/s through a follower). Defaults as shipped: deltas every
10 s, a full every hour ("0 * * * *"), retention after each full.

Prints, per kind (LIST, GET head.json, GET other, HEAD, PUT, POST multipart, DELETE), the count and
the rate per hour, and the deltas the writer reported, so "at most two requests per delta, no LIST
in steady state" can be read off directly.

Usage: bench/fleet.py --etcd PATH [--warden PATH] [--minutes 60] [--rate 0] [--net 127.70]
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from cluster import member_argv, role, status
from supervision import get, poll

S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
          "AWS_ALLOW_HTTP": "true", "AWS_EC2_METADATA_DISABLED": "true"}


def kind(request):
    method, path = request.split()[:2]
    if method == "GET" and ("list-type" in path or "prefix=" in path):
        return "LIST"
    if method == "GET":
        return "GET head.json" if path.split("?")[0].endswith("head.json") else "GET other"
    if method == "POST":
        return "POST (multipart)"
    return method


def requests(log):
    """The request lines in moto's log (werkzeug: ... "GET /path HTTP/1.1" 200 -)."""
    out = []
    with open(log, errors="replace") as f:
        for line in f:
            parts = line.split('"')
            if len(parts) > 1 and parts[1].split(" ")[0] in ("GET", "PUT", "POST", "HEAD", "DELETE"):
                out.append(parts[1])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--etcd", required=True)
    ap.add_argument("--warden", default="target/release/etcd-warden")
    ap.add_argument("--load", default="target/release/examples/load")
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--rate", type=int, default=0)
    ap.add_argument("--show", action="store_true", help="print every request but the head reads")
    ap.add_argument("--net", default="127.70", help="the first two octets of the members' loopback addresses")
    a = ap.parse_args()
    ips = [f"{a.net}.0.{i + 1}" for i in range(3)]
    moto_ip = f"{a.net}.1.1"
    procs = []
    with tempfile.TemporaryDirectory(prefix="warden-fleet-", dir="/var/tmp") as tmp:
        log = os.path.join(tmp, "moto.log")
        try:
            moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", moto_ip, "-p", "5000"],
                                    stdout=subprocess.DEVNULL, stderr=open(log, "w"))
            procs.append(moto)
            poll("moto", lambda: get(f"http://{moto_ip}:5000/")[0] is not None, timeout=60, every=0.1)
            req = urllib.request.Request(f"http://{moto_ip}:5000/fleet", method="PUT")
            urllib.request.urlopen(req, timeout=10).read()
            env = dict(os.environ, RUST_LOG="warn", AWS_ENDPOINT_URL=f"http://{moto_ip}:5000", **S3_ENV)
            for i, ip in enumerate(ips):
                procs.append(subprocess.Popen(
                    [a.warden, "run", "--listen", f"{ip}:2378", "--store", "s3://fleet/c", "--",
                     *member_argv(a.etcd, ips, i, f"{tmp}/m{i}")],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env))
            for ip in ips:
                poll(f"{ip} ready", lambda ip=ip: get(f"http://{ip}:2378/readyz")[0] == 200, timeout=60)
            writer = poll("one writer", lambda: [ip for ip in ips if role(ip) == "writer"], timeout=60)[0]
            poll("the first full", lambda: status(writer).get("backup", {}).get("fulls_total", 0) >= 1, timeout=120)
            start = len(requests(log))
            deltas0 = status(writer)["backup"].get("deltas_total", 0)
            fulls0 = status(writer)["backup"].get("fulls_total", 0)
            t0 = time.monotonic()
            seconds = int(a.minutes * 60)
            if a.rate:
                via = next(ip for ip in ips if ip != writer)
                load = subprocess.run([a.load, f"http://{via}:2379", str(seconds), "4", str(a.rate)],
                                      capture_output=True, text=True, check=True).stdout.strip()
            else:
                load = "no writes"
                time.sleep(seconds)
            window = time.monotonic() - t0
            time.sleep(1)
            writers = [ip for ip in ips if role(ip) == "writer"]
            b = status(writer)["backup"]
            deltas, fulls = b.get("deltas_total", 0) - deltas0, b.get("fulls_total", 0) - fulls0
            counts = {}
            for r in requests(log)[start:]:
                counts[kind(r)] = counts.get(kind(r), 0) + 1
                if a.show and kind(r) != "GET head.json":
                    print(f"  {r}", file=sys.stderr)
        finally:
            for p in reversed(procs):
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    hours = window / 3600
    total = sum(counts.values())
    print(f"fleet cost: 3 members, moto S3, {'quiet' if not a.rate else f'busy ({load})'}, "
          f"{window / 60:.1f} min, deltas every 10 s, hourly fulls")
    print(f"  writer(s) at the end: {writers}; deltas {deltas}, fulls {fulls} in the window")
    for k in ("LIST", "GET head.json", "GET other", "HEAD", "PUT", "POST (multipart)", "DELETE"):
        n = counts.get(k, 0)
        print(f"  {k:<18} {n:>7}   {n / hours:9.1f} /h")
    per_delta = (counts.get("PUT", 0) + counts.get("POST (multipart)", 0)) / deltas if deltas else 0
    print(f"  all requests {total} ({total / hours:.1f} /h); writes per delta {per_delta:.2f}")


if __name__ == "__main__":
    main()
