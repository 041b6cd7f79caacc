#!/usr/bin/env python3
"""Full-snapshot benchmark against the physical limit, side by side in one run (A B A B, medians).

For each DB size (Kubernetes-like JSON values that compress about 2.7x with zstd), every round:
  etcdctl snapshot save to a local file           etcd's stream alone (the first limit)
  etcd-warden snapshot -> file store, zstd        (and the object the uploads below send)
and for each S3 server, moto (Python) and s3s-fs (native, Rust), in alternating order:
  boto3 multipart upload of that zstd object      the plain upload alone (the second limit)
  etcd-warden snapshot -> the server, zstd        with the CPU-seconds of the warden, etcd and the
                                                  server during the run
The ratio is the warden's wall time over max(etcd's stream, the plain upload, the CPU floor), the
floor being the CPU-seconds of every process in the run divided by the cores: on 2 cores a run that
needs 6 CPU-seconds cannot take less than 3 s, whatever each part takes alone. Each term is printed.

The plain upload is timed in two steps: its parts (8 MiB, two at a time, as the warden sends them)
and the server's CompleteMultipartUpload. s3s-fs (and moto) copy every part into the final object
there, after the last byte arrived, so no client can overlap it with anything: the second ratio is
the warden over max(etcd's stream, the parts alone, the CPU floor without the completion) + the
completion. (A real S3 completes in metadata, in milliseconds.) The floor's share of the
completion is taken as its wall time: the servers copy the parts in one sequential loop, so it is
at most one busy core, and subtracting the wall time can only lower the floor (a stricter ratio).
Needs botocore >= 1.36 (request_checksum_calculation).

Usage: bench/snapshot.py --etcd PATH [--sizes 400,1024,2048] [--rounds 3] [--s3s-fs PATH]
"""
import argparse
import concurrent.futures
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
TICK = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count()


def run(cmd, env=None):
    """Wall time, peak RSS (MiB), bytes written to disk and CPU-seconds of one command, via GNU time
    (a small C program, so the figures are the command's own, not a forked Python's)."""
    t0 = time.monotonic()
    p = subprocess.run(["/usr/bin/time", "-f", "@@%M %O %U %S", *cmd], env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({p.returncode}): {p.stderr[-2000:]}")
    line = [l for l in p.stderr.splitlines() if l.startswith("@@")][-1]
    rss_kib, blocks, user, sys_ = line[2:].split()
    return wall, int(rss_kib) / 1024.0, int(blocks) * 512, float(user) + float(sys_), p.stdout


def cpu_seconds(pid):
    """utime + stime of a running process and its reaped children, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / TICK


def wait_port(host, port, what, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


PART = 8 << 20


def plain_upload(s3, path, key):
    """boto3's multipart upload by hand (8 MiB parts, two in flight): (total, the completion alone)."""
    t0 = time.monotonic()
    up = s3.create_multipart_upload(Bucket="bench", Key=key)["UploadId"]

    def put(i):
        with open(path, "rb") as f:
            f.seek(i * PART)
            body = f.read(PART)
        etag = s3.upload_part(Bucket="bench", Key=key, UploadId=up, PartNumber=i + 1, Body=body)["ETag"]
        return {"PartNumber": i + 1, "ETag": etag}

    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        parts = list(ex.map(put, range((os.path.getsize(path) + PART - 1) // PART)))
    t1 = time.monotonic()
    s3.complete_multipart_upload(Bucket="bench", Key=key, UploadId=up, MultipartUpload={"Parts": parts})
    t2 = time.monotonic()
    return t2 - t0, t2 - t1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--etcd", required=True)
    ap.add_argument("--warden", default="target/release/etcd-warden")
    ap.add_argument("--fill", default="target/release/examples/fill")
    ap.add_argument("--s3s-fs", default=os.environ.get("S3S_FS", os.path.expanduser("~/.cache/etcd-warden/s3s-fs/bin/s3s-fs")))
    ap.add_argument("--sizes", default="400,1024,2048")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compare", help="another etcd-warden binary, timed to each server right after --warden")
    ap.add_argument("--servers", default="moto,s3s-fs",
                    help="the S3 servers to time against (moto keeps every object in memory: leave it out at 8 GiB)")
    a = ap.parse_args()
    wanted = set(a.servers.split(","))
    etcdctl = os.path.join(os.path.dirname(a.etcd), "etcdctl")
    tmp = tempfile.mkdtemp(prefix="warden-bench-", dir=os.environ.get("BENCH_DIR", "/var/tmp"))
    procs = []
    try:
        import boto3
        import botocore.config
        servers = {}
        moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", IP, "-p", "5000"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(moto)
        os.makedirs(os.path.join(tmp, "s3s"))
        native = subprocess.Popen([a.s3s_fs, "--host", IP, "--port", "5001", "--access-key", "bench",
                                   "--secret-key", "bench", os.path.join(tmp, "s3s")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(native)
        for name, port, p in [("moto", 5000, moto), ("s3s-fs", 5001, native)]:
            if name not in wanted:
                continue
            wait_port(IP, port, name)
            # No per-part CRC (botocore adds one by default; the warden sends none, and a server
            # then combines them at completion): the same requests the warden makes.
            s3 = boto3.client("s3", endpoint_url=f"http://{IP}:{port}", aws_access_key_id="bench",
                              aws_secret_access_key="bench", region_name="us-east-1",
                              config=botocore.config.Config(request_checksum_calculation="when_required",
                                                            response_checksum_validation="when_required"))
            s3.create_bucket(Bucket="bench")
            env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1",
                       AWS_ENDPOINT_URL=f"http://{IP}:{port}", AWS_ALLOW_HTTP="true",
                       AWS_EC2_METADATA_DISABLED="true", RUST_LOG="warn")
            servers[name] = (s3, env, p)
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
            print(run([a.fill, f"http://{IP}:2379", str(size)])[4].strip(), file=sys.stderr)
            keys = ["etcdctl", "file"] + [f"{k}:{n}" for n in servers
                                          for k in ("upload", "complete", "warden", "cpu", "floor", "ratio",
                                                    "serial", "compare")]
            res = {k: [] for k in keys}
            rss = {}
            for r in range(a.rounds):
                out = os.path.join(tmp, "etcdctl.db")
                w, m, _, _, _ = run([etcdctl, f"--endpoints=http://{IP}:2379", "snapshot", "save", out],
                                    env=dict(os.environ, ETCDCTL_API="3"))
                res["etcdctl"].append(w)
                raw = os.path.getsize(out)
                os.remove(out)
                store = os.path.join(tmp, "store")
                shutil.rmtree(store, ignore_errors=True)
                w, m, _, _, _ = run([a.warden, "snapshot", "--store", f"file://{store}", "--endpoints",
                                     f"http://{IP}:2379", "--compression", "zstd"], env=next(iter(servers.values()))[1])
                res["file"].append(w)
                rss["file"] = max(rss.get("file", 0), m)
                obj = next(os.path.join(dp, f) for dp, _, fs in os.walk(store) for f in fs)
                stored = os.path.getsize(obj)
                shutil.move(obj, os.path.join(tmp, "obj.ews"))
                shutil.rmtree(store, ignore_errors=True)
                order = list(servers) if r % 2 == 0 else list(reversed(servers))
                for name in order:
                    s3, env, server = servers[name]
                    up, complete = plain_upload(s3, os.path.join(tmp, "obj.ews"), f"boto/r{r}.ews")
                    res[f"upload:{name}"].append(up)
                    res[f"complete:{name}"].append(complete)
                    before = cpu_seconds(etcd.pid) + cpu_seconds(server.pid)
                    w, m, _, own, _ = run([a.warden, "snapshot", "--store", f"s3://bench/r{r}", "--endpoints",
                                           f"http://{IP}:2379", "--compression", "zstd"], env=env)
                    others = cpu_seconds(etcd.pid) + cpu_seconds(server.pid) - before
                    res[f"warden:{name}"].append(w)
                    res[f"cpu:{name}"].append((own, others))
                    floor = (own + others) / CORES
                    res[f"floor:{name}"].append(floor)
                    res[f"ratio:{name}"].append(w / max(res["etcdctl"][-1], res[f"upload:{name}"][-1], floor))
                    res[f"serial:{name}"].append(w / (max(res["etcdctl"][-1], up - complete,
                                                          (own + others - complete) / CORES) + complete))
                    rss[name] = max(rss.get(name, 0), m)
                    if a.compare:
                        res[f"compare:{name}"].append(run([a.compare, "snapshot", "--store", f"s3://bench/c{r}",
                                                           "--endpoints", f"http://{IP}:2379", "--compression",
                                                           "zstd"], env=env)[0])
                    for key in [o["Key"] for o in s3.list_objects_v2(Bucket="bench").get("Contents", [])]:
                        s3.delete_object(Bucket="bench", Key=key)
            rows.append((size, raw, stored, res, rss))
            etcd.send_signal(signal.SIGTERM)
            etcd.wait()
            procs.remove(etcd)
            shutil.rmtree(data, ignore_errors=True)

        med = statistics.median
        print(f"full snapshot benchmark ({a.rounds} rounds per size, medians; {CORES} cores; etcd {a.etcd})")
        for size, raw, stored, res, rss in rows:
            print(f"{raw / 2**20:.0f} MiB DB (zstd object {stored / 2**20:.0f} MiB, {raw / stored:.2f}x smaller)")
            print(f"  etcdctl snapshot save to a file        {med(res['etcdctl']):7.2f} s")
            print(f"  warden -> file store, zstd             {med(res['file']):7.2f} s  "
                  f"({med(res['file']) / med(res['etcdctl']):.2f}x etcdctl, peak RSS {rss['file']:.1f} MiB)")
            for name in servers:
                cpu = res[f"cpu:{name}"]
                print(f"  {name}: boto3 upload of the object     {med(res[f'upload:{name}']):7.2f} s  "
                      f"(of which the server's CompleteMultipartUpload {med(res[f'complete:{name}']):.2f} s)")
                print(f"  {name}: CPU floor                      {med(res[f'floor:{name}']):7.2f} s  "
                      f"(warden {med(c[0] for c in cpu):.2f} + etcd and {name} {med(c[1] for c in cpu):.2f} CPU-s, "
                      f"/ {CORES})")
                print(f"  {name}: warden -> S3, zstd             {med(res[f'warden:{name}']):7.2f} s  "
                      f"ratio {med(res[f'ratio:{name}']):.2f}x of max(stream, upload, floor) "
                      f"(rounds {', '.join(f'{x:.2f}' for x in res[f'ratio:{name}'])}), peak RSS {rss[name]:.1f} MiB, "
                      f"{raw / med(res[f'warden:{name}']) / 2**20:.0f} MiB/s, "
                      f"{med(c[0] for c in cpu) / raw * 1e9:.2f} warden CPU-ns per DB byte")
                print(f"  {name}: ratio with the server's completion after the last byte: "
                      f"{med(res[f'serial:{name}']):.2f}x (rounds {', '.join(f'{x:.2f}' for x in res[f'serial:{name}'])})")
                if a.compare:
                    print(f"  {name}: {a.compare} -> S3, zstd {med(res[f'compare:{name}']):7.2f} s  "
                          f"(rounds {', '.join(f'{x:.2f}' for x in res[f'compare:{name}'])}; "
                          f"--warden rounds {', '.join(f'{x:.2f}' for x in res[f'warden:{name}'])})")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
