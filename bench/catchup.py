#!/usr/bin/env python3
"""Catch-up benchmark: a data dir behind the store (an old disk put back) is brought to the store's
newest revision by `run`'s start-up check, which writes the missing revisions into its own db
(`restore::catchup`), against the whole restore the same check does for a lost data dir, in the
same run, on the same store. Reports, per round: the catch-up's own seconds (from its log line),
start to /readyz 200 for both, the warden's peak RSS, and the cost per missing revision. Each
result is checked: etcd serves the store's last revision with the original's HashKV there. With
--s3s-fs the store is a native S3 server on loopback instead of files.

Usage: bench/catchup.py --etcd PATH [--mib 1024] [--revisions 20000] [--rounds 2] [--s3s-fs PATH]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from restore import IP, hashkv, poll, port_free, revision, status  # noqa: E402


def ready():
    try:
        with urllib.request.urlopen(f"http://{IP}:2378/readyz", timeout=2) as r:
            return r.status == 200
    except Exception:
        return False


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def stamp(line):
    """The seconds of the day of a warden log line's leading RFC 3339 time."""
    t = line.split()[0].split("T")[1].rstrip("Z")
    h, m, sec = t.split(":")
    return int(h) * 3600 + int(m) * 60 + float(sec)


S3_PORT = 5001


def s3_env():
    """The warden's S3 settings for the s3s-fs this bench starts (--s3s-fs): explicit endpoint and
    credentials, nothing looked up elsewhere."""
    return dict(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1",
                AWS_ENDPOINT_URL=f"http://{IP}:{S3_PORT}", AWS_ALLOW_HTTP="true", AWS_EC2_METADATA_DISABLED="true")


def sign_key(tmp):
    """An Ed25519 key made by openssl: a catch-up writes in place only a signed store's deltas."""
    key = os.path.join(tmp, "sign.pem")
    if not os.path.exists(key):
        subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", key], check=True)
    return key


def warden(a, store, etcd_flags, log):
    if not port_free():
        raise SystemExit(f"something already listens on {IP}:2379")
    env = dict(os.environ, RUST_LOG="info", **(s3_env() if store.startswith("s3://") else {}))
    # Beside the data dir, in the run's own temporary dir.
    key = sign_key(os.path.dirname(etcd_flags[etcd_flags.index("--data-dir") + 1]))
    return subprocess.Popen([a.warden, "run", "--listen", f"{IP}:2378", "--store", store,
                             "--delta-snapshot-period", "2s", "--restore-bump-revision", "0",
                             "--sign-key", key, "--", a.etcd, *etcd_flags],
                            stdout=log, stderr=subprocess.STDOUT, env=env)


def stop(w):
    w.terminate()
    w.wait()


def copy(src, dst):
    shutil.rmtree(dst, ignore_errors=True)
    subprocess.run(["cp", "-a", "--reflink=auto", src, dst], check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--etcd", required=True)
    ap.add_argument("--warden", default="target/release/etcd-warden")
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--revisions", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--s3s-fs", help="the store in this s3s-fs (a native S3 server) on loopback instead of files")
    a = ap.parse_args()
    ctl = os.path.join(os.path.dirname(a.etcd), "etcdctl")
    tmp = tempfile.mkdtemp(prefix="warden-catchup-", dir="/var/tmp")
    data, store = os.path.join(tmp, "data"), f"file://{tmp}/store"
    server = None
    if a.s3s_fs:
        # s3s-fs serves each directory of its root as a bucket.
        os.makedirs(os.path.join(tmp, "s3s", "bench"))
        server = subprocess.Popen([a.s3s_fs, "--host", IP, "--port", str(S3_PORT), "--access-key", "bench",
                                   "--secret-key", "bench", os.path.join(tmp, "s3s")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        poll("s3s-fs listening", lambda: not port_free(S3_PORT), timeout=30)
        store = "s3://bench/catchup"
    old = os.path.join(tmp, "old-disk")
    etcd_flags = ["--name", "m1", "--data-dir", data,
                  "--listen-client-urls", f"http://{IP}:2379", "--advertise-client-urls", f"http://{IP}:2379",
                  "--listen-peer-urls", f"http://{IP}:2380", "--initial-advertise-peer-urls", f"http://{IP}:2380",
                  "--initial-cluster", f"m1=http://{IP}:2380", "--log-level", "error",
                  "--quota-backend-bytes", str(8 << 30)]
    try:
        # 1. The DB, written without the warden; then the warden's full snapshot of it.
        e = subprocess.Popen([a.etcd, *etcd_flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        poll("etcd for the fill", lambda: e.poll() is None and revision(ctl), timeout=60)
        print(subprocess.run(["target/release/examples/fill", f"http://{IP}:2379", str(a.mib)],
                             capture_output=True, text=True, check=True).stdout.strip(), file=sys.stderr)
        e.terminate(); e.wait()
        with open(os.path.join(tmp, "prepare.log"), "w") as log:
            w = warden(a, store, etcd_flags, log)
            try:
                poll("the full snapshot", lambda: status()["backup"]["fulls_total"] >= 1, timeout=1800)
                # A few writes after the full: an old disk is rarely at a full's exact revision (the
                # catch-up compares the revisions of the delta that holds the disk's).
                subprocess.run(["target/release/examples/load", f"http://{IP}:2379", "2", "8"],
                               capture_output=True, text=True, check=True)
                at = revision(ctl)
                poll("the store at etcd's revision",
                     lambda: status()["backup"]["backed_up_revision"] >= at, timeout=600)
            finally:
                stop(w)
            # 2. The old disk: the data dir as the warden left it.
            copy(data, old)
            behind = None
            w = warden(a, store, etcd_flags, log)
            try:
                poll("ready", ready, timeout=600)
                behind = revision(ctl)
                # 3. The revisions the old disk will miss.
                while revision(ctl) - behind < a.revisions:
                    left = a.revisions - (revision(ctl) - behind)
                    subprocess.run(["target/release/examples/load", f"http://{IP}:2379",
                                    str(max(2, min(30, left // 8000 + 1))), "32"],
                                   capture_output=True, text=True, check=True)
                final = revision(ctl)
                poll("the store to catch up", lambda: status()["backup"]["backed_up_revision"] >= final, timeout=600)
                want = hashkv(ctl, final)
            finally:
                stop(w)
        db_mib = os.path.getsize(os.path.join(data, "member/snap/db")) >> 20
        print(f"DB {db_mib} MiB; the old disk at revision {behind}, the store at {final} "
              f"({final - behind} revisions missing)", file=sys.stderr)

        def timed_start(what, check_log):
            logpath = os.path.join(tmp, f"{what}.log")
            with open(logpath, "w") as log:
                t0 = time.monotonic()
                w = warden(a, store, etcd_flags, log)
                try:
                    poll(f"{what}: ready", ready, timeout=1800)
                    took = time.monotonic() - t0
                    rss = peak_rss_mib(w.pid)
                    rev, got = revision(ctl), hashkv(ctl, final)
                finally:
                    stop(w)
            text = open(logpath).read()
            if check_log not in text:
                raise SystemExit(f"{what}: '{check_log}' not in its log:\n{text[-3000:]}")
            if rev != final or got != want:
                raise SystemExit(f"{what}: etcd serves revision {rev} with HashKV {got}, want {final} and {want}")
            secs = None
            marks = {}
            for line in text.splitlines():
                if check_log in line and " seconds=" in line:
                    secs = float(line.split(" seconds=")[1].split()[0])
                for mark in ("validating the data dir", "the data dir starts", "etcd started pid"):
                    if mark in line and not line.startswith("{"):
                        marks.setdefault(mark, stamp(line))
            validate = (marks["the data dir starts"] - marks["validating the data dir"]
                        if "the data dir starts" in marks else 0.0)
            return took, secs, rss, validate

        rows = []
        for r in range(a.rounds):
            # Each first in turn: the page cache favours neither.
            for what in (["catch-up", "restore"] if r % 2 == 0 else ["restore", "catch-up"]):
                shutil.rmtree(data, ignore_errors=True)
                for p in os.listdir(tmp):
                    if p.startswith("data."):
                        shutil.rmtree(os.path.join(tmp, p), ignore_errors=True)
                if what == "catch-up":
                    copy(old, data)
                    got = timed_start(what, "data dir caught up from the store's deltas")
                else:
                    got = timed_start(what, "data dir restored")
                rows.append((what, *got))
                print(f"round {r} {what}: ready in {got[0]:.2f} s (its own step {got[1]} s, the private etcd's "
                      f"validation {got[3]:.2f} s), warden peak RSS {got[2]:.1f} MiB", file=sys.stderr)
        missing = final - behind
        for what in ("catch-up", "restore"):
            mine = [x for x in rows if x[0] == what]
            ready_s = sorted(x[1] for x in mine)[len(mine) // 2]
            step = sorted(x[2] for x in mine)[len(mine) // 2]
            rss = max(x[3] for x in mine)
            validate = sorted(x[4] for x in mine)[len(mine) // 2]
            print(f"{what:9} ready {ready_s:7.2f} s  step {step:7.2f} s  validation {validate:6.2f} s  peak RSS {rss:6.1f} MiB"
                  + (f"  {step / missing * 1e6:.1f} µs per missing revision" if what == "catch-up" else ""))
        cu = sorted(x[1] for x in rows if x[0] == "catch-up")[a.rounds // 2]
        rs = sorted(x[1] for x in rows if x[0] == "restore")[a.rounds // 2]
        print(f"DB {db_mib} MiB, {missing} revisions missing: catch-up to ready is {cu / rs:.2f}x the whole restore's")
    finally:
        if server:
            server.terminate()
            server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
