#!/usr/bin/env python3
"""Full-snapshot benchmark, side by side in one run (A B A B, medians).

For each DB size (Kubernetes-like JSON values that compress about 2x):
  A  etcdctl snapshot save to a local file           (etcd's own stream: the first limit)
  B  etcd-warden snapshot -> file store, zstd/gzip/none
  C  etcd-warden snapshot -> moto S3, zstd
  D  boto3 multipart upload of the same zstd object to the same moto (the store's limit)
Ratios: local = B / A;  S3 = C / max(A, D).  Peak RSS and blocks written come from wait4(2) per
process; a zero-temp-file pipeline writes ~0 bytes to disk when the store is S3.

Usage: bench/snapshot.py --etcd PATH --sizes 256,1024 --rounds 3
"""
import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

IP = "127.79.0.1"


def run(cmd, env=None):
    """Wall time, peak RSS (MiB) and bytes written to disk of one command, via GNU time (a small C
    program, so the peak is the command's own, not a forked Python's)."""
    t0 = time.monotonic()
    p = subprocess.run(["/usr/bin/time", "-f", "@@%M %O", *cmd], env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({p.returncode}): {p.stderr[-2000:]}")
    line = [l for l in p.stderr.splitlines() if l.startswith("@@")][-1]
    rss_kib, blocks = line[2:].split()
    return wall, int(rss_kib) / 1024.0, int(blocks) * 512, p.stdout


def wait_port(host, port, what, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--etcd", required=True)
    ap.add_argument("--warden", default="target/release/etcd-warden")
    ap.add_argument("--fill", default="target/release/examples/fill")
    ap.add_argument("--sizes", default="256,1024")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    etcdctl = os.path.join(os.path.dirname(a.etcd), "etcdctl")
    tmp = tempfile.mkdtemp(prefix="warden-bench-", dir=os.environ.get("BENCH_DIR", "/var/tmp"))
    procs = []
    try:
        moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", IP, "-p", "5000"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(moto)
        wait_port(IP, 5000, "moto")
        import boto3
        from boto3.s3.transfer import TransferConfig
        s3 = boto3.client("s3", endpoint_url=f"http://{IP}:5000", aws_access_key_id="bench",
                          aws_secret_access_key="bench", region_name="us-east-1")
        s3.create_bucket(Bucket="bench")
        env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1",
                   AWS_ENDPOINT_URL=f"http://{IP}:5000", AWS_ALLOW_HTTP="true", RUST_LOG="warn")
        rows = []
        for size in [int(s) for s in a.sizes.split(",")]:
            data = os.path.join(tmp, f"etcd-{size}")
            etcd = subprocess.Popen([a.etcd, "--name", "b", "--data-dir", data,
                                     "--listen-client-urls", f"http://{IP}:2379", "--advertise-client-urls", f"http://{IP}:2379",
                                     "--listen-peer-urls", f"http://{IP}:2380", "--initial-advertise-peer-urls", f"http://{IP}:2380",
                                     "--initial-cluster", f"b=http://{IP}:2380", "--quota-backend-bytes", str(8 << 30),
                                     "--log-level", "error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(etcd)
            wait_port(IP, 2379, "etcd")
            time.sleep(1)
            print(run([a.fill, f"http://{IP}:2379", str(size)])[3].strip(), file=sys.stderr)
            res = {k: [] for k in ["etcdctl", "zstd", "gzip", "none", "s3", "boto3"]}
            rss = {k: [] for k in res}
            disk = {k: [] for k in res}
            for r in range(a.rounds):
                out = os.path.join(tmp, "etcdctl.db")
                w, m, b, _ = run([etcdctl, f"--endpoints=http://{IP}:2379", "snapshot", "save", out],
                                 env=dict(os.environ, ETCDCTL_API="3"))
                res["etcdctl"].append(w); rss["etcdctl"].append(m); disk["etcdctl"].append(b)
                raw = os.path.getsize(out)
                os.remove(out)
                for comp in ["zstd", "gzip", "none"]:
                    store = os.path.join(tmp, "store")
                    shutil.rmtree(store, ignore_errors=True)
                    w, m, b, _ = run([a.warden, "snapshot", "--store", f"file://{store}", "--endpoints",
                                      f"http://{IP}:2379", "--compression", comp], env=env)
                    res[comp].append(w); rss[comp].append(m); disk[comp].append(b)
                    if comp == "zstd":
                        obj = next(os.path.join(dp, f) for dp, _, fs in os.walk(store) for f in fs)
                        stored = os.path.getsize(obj)
                        shutil.copy(obj, os.path.join(tmp, "obj.ews"))
                    shutil.rmtree(store, ignore_errors=True)
                w, m, b, _ = run([a.warden, "snapshot", "--store", f"s3://bench/r{r}", "--endpoints",
                                  f"http://{IP}:2379", "--compression", "zstd"], env=env)
                res["s3"].append(w); rss["s3"].append(m); disk["s3"].append(b)
                t0 = time.monotonic()
                s3.upload_file(os.path.join(tmp, "obj.ews"), "bench", f"boto/r{r}.ews",
                               Config=TransferConfig(multipart_chunksize=8 << 20, max_concurrency=2))
                res["boto3"].append(time.monotonic() - t0)
                for key in [o["Key"] for o in s3.list_objects_v2(Bucket="bench").get("Contents", [])]:
                    s3.delete_object(Bucket="bench", Key=key)
            med = {k: statistics.median(v) for k, v in res.items() if v}
            limit = max(med["etcdctl"], med["boto3"])
            rows.append((size, raw, stored, med, {k: max(v) for k, v in rss.items() if v},
                         {k: statistics.median(v) for k, v in disk.items() if v}, limit))
            etcd.send_signal(signal.SIGTERM)
            etcd.wait()
            procs.remove(etcd)
            shutil.rmtree(data, ignore_errors=True)

        print(f"full snapshot benchmark ({a.rounds} rounds per size, medians; etcd {a.etcd})")
        print(f"{'DB':>8} {'what':<26} {'wall':>8} {'ratio':>7} {'peak RSS':>9} {'disk written':>13}")
        for size, raw, stored, med, rss, disk, limit in rows:
            label = f"{raw / 2**20:.0f}MiB"
            print(f"{label:>8} {'etcdctl snapshot save':<26} {med['etcdctl']:7.2f}s {'1.00x':>7} {rss['etcdctl']:7.1f}MiB {disk['etcdctl'] / 2**20:10.1f}MiB")
            for comp in ["zstd", "gzip", "none"]:
                print(f"{'':>8} {'warden -> file, ' + comp:<26} {med[comp]:7.2f}s {med[comp] / med['etcdctl']:6.2f}x {rss[comp]:7.1f}MiB {disk[comp] / 2**20:10.1f}MiB")
            print(f"{'':>8} {'boto3 upload to moto':<26} {med['boto3']:7.2f}s {'':>7} (object {stored / 2**20:.0f} MiB, {raw / stored:.2f}x smaller)")
            print(f"{'':>8} {'warden -> moto S3, zstd':<26} {med['s3']:7.2f}s {med['s3'] / limit:6.2f}x {rss['s3']:7.1f}MiB {disk['s3'] / 2**20:10.1f}MiB   (ratio to max(etcdctl, boto3))")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
