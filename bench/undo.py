#!/usr/bin/env python3
"""Undo benchmark: `etcd-warden diff` and `etcd-warden undo` of 10,000 keys under a prefix in a
~1 GiB database, their wall time and peak RSS (from the kernel's rusage of each run). Also what
`--kube-encryption-config` adds to each full: the key check reads the full's own bytes as they
stream, so the full with the check (until the check's answer) is timed against a plain full of the
same database by `etcd-warden snapshot` in the same run, with the warden's CPU time and peak RSS
and etcd's CPU time.

A warden (file store) runs etcd; `fill` writes --mib MiB of Kubernetes-like objects elsewhere and
--keys objects of ~4 KiB under /registry/secrets/shop/; a full snapshot is taken (SIGUSR1), the
point noted, then the prefix deleted (the namespace-deleted accident). `diff` must list every key
as to re-create, `undo` must bring them all back (checked with etcdctl's count).

Usage: bench/undo.py --etcd PATH [--mib 1024] [--keys 10000] [--warden BINARY] [--timeout 600]
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

IP = "127.79.5.1"
WARDEN = "target/release/etcd-warden"
PREFIX = "/registry/secrets/shop/"


def poll(what, f, timeout=600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = f()
        if v:
            return v
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def status():
    try:
        with urllib.request.urlopen(f"http://{IP}:2378/status", timeout=2) as r:
            return json.loads(r.read())
    except Exception:
        return None


def ctl(etcd, *args):
    return subprocess.run([os.path.join(os.path.dirname(etcd), "etcdctl"), "--endpoints", f"http://{IP}:2379",
                           "--command-timeout", "120s", *args], check=True, capture_output=True, text=True).stdout


def count(etcd):
    """The keys under PREFIX, as etcdctl counts them."""
    out = ctl(etcd, "get", PREFIX, "--prefix", "--count-only", "-w", "fields")
    return int(next(l for l in out.splitlines() if l.startswith('"Count"')).split(":")[1])


def revision(etcd):
    return json.loads(ctl(etcd, "endpoint", "status", "-w", "json"))[0]["Status"]["header"]["revision"]


def backed_up(rev):
    poll(f"revision {rev} in the store",
         lambda: (s := status()) and (s["backup"].get("backed_up_revision") or 0) >= rev)


def cpu_seconds(pid):
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vm(pid, field):
    """A /proc/PID/status size (VmRSS, VmHWM) in MiB."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(field + ":")) / 1024


def measured(warden, args):
    """Runs the warden with `args`: (seconds, peak RSS MiB, stdout)."""
    t0 = time.monotonic()
    p = subprocess.Popen([warden, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = p.stdout.read()
    err = p.stderr.read()
    _, code, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(code)
    took = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"{args[0]} failed ({p.returncode}): {err.decode()}")
    return took, usage.ru_maxrss / 1024, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--etcd", required=True)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--keys", type=int, default=10000)
    ap.add_argument("--warden", default=WARDEN, help="the etcd-warden binary (another build, to compare)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds to wait for the key check")
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="bench-undo-")
    store = f"file://{d}/store"
    log = open(os.path.join(d, "warden.log"), "w")
    argv = [a.etcd, "--name", "m0", "--data-dir", os.path.join(d, "data"),
            "--listen-client-urls", f"http://{IP}:2379", "--advertise-client-urls", f"http://{IP}:2379",
            "--listen-peer-urls", f"http://{IP}:2380", "--initial-advertise-peer-urls", f"http://{IP}:2380",
            "--initial-cluster", f"m0=http://{IP}:2380", "--quota-backend-bytes", str(8 << 30)]
    keys_config = os.path.join(d, "encryption.yaml")
    with open(keys_config, "w") as f:
        f.write("apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n"
                "- resources: [secrets]\n  providers:\n  - aescbc:\n      keys:\n      - name: key1\n"
                "        secret: c2VjcmV0IGlzIHNlY3VyZSwgb3IgaXMgaXQ/Cg==\n  - identity: {}\n")
    w = subprocess.Popen([a.warden, "run", "--listen", f"{IP}:2378", "--store", store,
                          "--delta-snapshot-period", "1s", "--kube-encryption-config", keys_config,
                          "--", *argv], stdout=log, stderr=subprocess.STDOUT)
    try:
        poll("the warden ready", lambda: (s := status()) and s.get("ready"))
        fill = "target/release/examples/fill"
        subprocess.run([fill, f"http://{IP}:2379", str(a.mib), "/registry/configmaps/bench/"], check=True,
                       capture_output=True)
        # fill writes objects of ~4 KiB: this many MiB is about --keys of them.
        subprocess.run([fill, f"http://{IP}:2379", str(max(1, a.keys * 4 // 1024)), PREFIX], check=True,
                       capture_output=True)
        keys = count(a.etcd)
        etcd_pid = status()["etcd"]["pid"]
        # A plain full of the same database, into a store of its own.
        cpu0 = cpu_seconds(etcd_pid)
        plain, plain_rss, _ = measured(a.warden, ["snapshot", "--store", f"file://{d}/plain",
                                                  "--endpoints", f"http://{IP}:2379"])
        plain_etcd = cpu_seconds(etcd_pid) - cpu0
        # The full of `run`, with the key check reading it as it streams.
        fulls = status()["backup"]["fulls_total"]
        with open(f"/proc/{w.pid}/clear_refs", "w") as f:
            f.write("5")  # resets the peak RSS (VmHWM) to the RSS now
        rss0 = vm(w.pid, "VmRSS")
        cpu0, wcpu0, t0 = cpu_seconds(etcd_pid), cpu_seconds(w.pid), time.monotonic()
        w.send_signal(signal.SIGUSR1)
        poll("a full snapshot of the filled database", lambda: status()["backup"]["fulls_total"] > fulls)
        full = status()["backup"]["last_full"]
        poll(f"the key check of {full['key']}",
             lambda: ((status()["backup"].get("kube_keys") or {}).get("full") == full["key"]), timeout=a.timeout)
        took = time.monotonic() - t0
        etcd_cpu, warden_cpu = cpu_seconds(etcd_pid) - cpu0, cpu_seconds(w.pid) - wcpu0
        hwm = vm(w.pid, "VmHWM")
        check = status()["backup"]["kube_keys"]
        assert not check.get("error"), f"the key check failed: {check['error']}"
        assert not check.get("note"), f"the key check read etcd: {check['note']}"
        print(f"key check: full with the check until its answer {took:.1f} s (the full {full['duration_seconds']:.1f} s; "
              f"warden {warden_cpu:.1f} CPU-s, peak RSS {hwm:.0f} MiB from {rss0:.0f} MiB before it; etcd {etcd_cpu:.1f} CPU-s); "
              f"plain full by `snapshot` {plain:.1f} s (peak RSS {plain_rss:.0f} MiB; etcd {plain_etcd:.1f} CPU-s): "
              f"{took / plain:.2f}x; needed {check['needed']}", flush=True)
        point = revision(a.etcd)
        backed_up(point)
        ctl(a.etcd, "del", PREFIX, "--prefix")
        backed_up(revision(a.etcd))
        db = status()["space"]["db_size"] >> 20
        print(f"undo: {keys} keys under {PREFIX} in a {db} MiB database; the prefix deleted after revision {point}",
              flush=True)
        common = ["--store", store, "--to-revision", str(point), "--prefix", PREFIX,
                  "--endpoints", f"http://{IP}:2379", "--scratch-dir", d, "--json"]
        took, rss, out = measured(a.warden, ["diff", *common])
        n = json.loads(out)["counts"]["re-create"]
        assert n == keys, f"diff lists {n} to re-create, {keys} were deleted"
        print(f"undo: diff {took:.1f} s, peak RSS {rss:.0f} MiB ({n} keys to re-create)", flush=True)
        took, rss, out = measured(a.warden, ["undo", *common])
        n = json.loads(out)["outcome"]["recreated"]
        back = count(a.etcd)
        assert n == keys and back == keys, f"undo re-created {n}, etcd counts {back}, {keys} expected"
        print(f"undo: undo {took:.1f} s, peak RSS {rss:.0f} MiB ({n} keys re-created, etcdctl counts {back})",
              flush=True)
    finally:
        w.send_signal(signal.SIGTERM)
        try:
            w.wait(timeout=60)
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
