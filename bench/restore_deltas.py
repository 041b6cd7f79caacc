#!/usr/bin/env python3
"""Restore of a quiet cluster's chain: hundreds of small deltas in moto's S3, where one round trip
after another would dominate. The warden writes ~20 puts/s with a 100 ms delta period to moto until
the chain holds --deltas objects; then `etcd-warden restore` from s3:// (and from a file:// copy of
the same objects, for the store's share) is timed, --rounds times each.

Usage: bench/restore_deltas.py --etcd PATH [--deltas 400] [--rounds 3] [--compare OTHER_WARDEN]
  (--compare: also restore from S3 with another build, in the same rounds)
"""
import argparse
import base64
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

IP = "127.83.0.1"
MOTO = "127.83.0.2"


def get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def put(key, value):
    body = json.dumps({"key": base64.b64encode(key.encode()).decode(),
                       "value": base64.b64encode(value.encode()).decode()}).encode()
    req = urllib.request.Request(f"http://{IP}:2379/v3/kv/put", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        r.read()


def poll(what, f, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = f()
            if v:
                return v
        except Exception:
            pass
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def listening(host, port):
    try:
        socket.create_connection((host, port), timeout=0.2).close()
        return True
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--etcd", required=True)
    ap.add_argument("--warden", default="target/release/etcd-warden")
    ap.add_argument("--deltas", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compare", help="another etcd-warden binary to time on the same S3 chain")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="warden-deltas-", dir="/var/tmp")
    s3 = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1",
              AWS_ENDPOINT_URL=f"http://{MOTO}:5000", AWS_ALLOW_HTTP="true", AWS_EC2_METADATA_DISABLED="true",
              RUST_LOG="warn")
    procs = []
    try:
        moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", MOTO, "-p", "5000"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(moto)
        poll("moto", lambda: listening(MOTO, 5000))
        import boto3
        client = boto3.client("s3", endpoint_url=f"http://{MOTO}:5000", aws_access_key_id="bench",
                              aws_secret_access_key="bench", region_name="us-east-1")
        client.create_bucket(Bucket="bench")
        data = os.path.join(tmp, "data")
        w = subprocess.Popen([a.warden, "run", "--listen", f"{IP}:2378", "--store", "s3://bench/many",
                              "--delta-snapshot-period", "100ms", "--", a.etcd, "--name", "m1", "--data-dir", data,
                              "--listen-client-urls", f"http://{IP}:2379", "--advertise-client-urls", f"http://{IP}:2379",
                              "--listen-peer-urls", f"http://{IP}:2380", "--initial-advertise-peer-urls",
                              f"http://{IP}:2380", "--initial-cluster", f"m1=http://{IP}:2380", "--log-level", "error"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=s3)
        procs.append(w)
        status = lambda: get(f"http://{IP}:2378/status")
        poll("the full snapshot", lambda: status()["backup"]["fulls_total"] >= 1)
        i = 0
        while status()["backup"]["deltas_total"] < a.deltas:
            put(f"/quiet/{i % 50}", f"value {i}")
            i += 1
            time.sleep(0.05)
        poll("the store to catch up",
             lambda: status()["backup"]["backed_up_revision"] >= status()["etcd"]["revision"])
        w.terminate(); w.wait()
        # A file:// copy of the same objects.
        files = os.path.join(tmp, "files")
        for page in client.get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix="many/"):
            for o in page.get("Contents", []):
                dest = os.path.join(files, o["Key"][len("many/"):])
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                client.download_file("bench", o["Key"], dest)
        res = {"s3": [], "file": [], "compare": []}
        runs = [("s3", a.warden, "s3://bench/many"), ("file", a.warden, f"file://{files}")]
        if a.compare:
            runs.append(("compare", a.compare, "s3://bench/many"))
        deltas = 0
        for r in range(a.rounds):
            for kind, warden, url in runs:
                out = os.path.join(tmp, f"{kind}{r}")
                t = time.monotonic()
                p = subprocess.run([warden, "restore", "--bump-revision", "0", "--store", url, "--data-dir", out, "--name", "m1",
                                    "--etcd", a.etcd], env=s3, capture_output=True, text=True)
                res[kind].append(time.monotonic() - t)
                if p.returncode != 0:
                    raise SystemExit(f"restore from {url} failed: {p.stderr[-2000:]}")
                deltas = int(re.search(r"\+(\d+) deltas", p.stdout + p.stderr).group(1))
                shutil.rmtree(out)
        ms, mf = statistics.median(res["s3"]), statistics.median(res["file"])
        print(f"restore of a chain of {deltas} small deltas ({a.rounds} rounds, medians): "
              f"moto S3 {ms:.2f}s ({1000 * ms / deltas:.1f} ms per delta), the same objects from files {mf:.2f}s")
        if a.compare:
            mc = statistics.median(res["compare"])
            print(f"  {a.compare} from moto S3: {mc:.2f}s ({1000 * mc / deltas:.1f} ms per delta), {mc / ms:.1f}x")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
