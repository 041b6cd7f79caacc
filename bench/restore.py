#!/usr/bin/env python3
"""Restore benchmark: a full snapshot of a ~1 GiB DB plus ~100,000 delta revisions, restored by
`etcd-warden restore`, against `etcdutl snapshot restore` of a snapshot of the same final DB, in
the same run (A B A B, medians); plus one restore with the deltas replayed through a private etcd
(the fallback path) for comparison. Peak RSS and wall time from GNU time. Each warden restore is
checked: etcd started on it must report the original's revision and HashKV (a hash over the bytes
of every stored revision).

Usage: bench/restore.py --etcd PATH [--mib 1024] [--revisions 100000] [--rounds 2] [--no-replay]
                        [--keep DIR]   (prepare the store in DIR once and reuse it on later runs)
                        [--compare BIN] (another etcd-warden, timed beside --warden, each first in turn)
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

IP = "127.81.0.1"


def timed(cmd, env=None):
    p = subprocess.run(["/usr/bin/time", "-f", "@@%e %M", *cmd], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed: {p.stderr[-3000:]}")
    line = [l for l in p.stderr.splitlines() if l.startswith("@@")][-1]
    wall, rss = line[2:].split()
    return float(wall), int(rss) / 1024.0, p.stdout


def timed_sampled(cmd, env=None):
    """Like timed(), plus the command's own peak RSS (VmHWM sampled from /proc until it exits), since
    GNU time's figure also covers the children it reaps (here the private etcd)."""
    p = subprocess.Popen(["/usr/bin/time", "-f", "@@%e %M", *cmd], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    own = 0.0
    child = None
    while p.poll() is None:
        if child is None:
            try:
                with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
                    kids = f.read().split()
                child = int(kids[0]) if kids else None
            except OSError:
                pass
        if child is not None:
            try:
                with open(f"/proc/{child}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            own = max(own, int(line.split()[1]) / 1024.0)
            except OSError:
                pass
        time.sleep(0.05)
    out, err = p.communicate()
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed: {err[-3000:]}")
    line = [l for l in err.splitlines() if l.startswith("@@")][-1]
    wall, rss = line[2:].split()
    return float(wall), own, int(rss) / 1024.0


def status():
    with urllib.request.urlopen(f"http://{IP}:2378/status", timeout=5) as r:
        return json.loads(r.read())


def hashkv(ctl, rev):
    p = subprocess.run([ctl, f"--endpoints=http://{IP}:2379", "endpoint", "hashkv", f"--rev={rev}", "-w", "json"],
                       env=dict(os.environ, ETCDCTL_API="3"), capture_output=True, text=True, check=True)
    return json.loads(p.stdout)[0]["HashKV"]["hash"]


def revision(ctl):
    """etcd's own answer: the revision in `endpoint status`."""
    p = subprocess.run([ctl, f"--endpoints=http://{IP}:2379", "endpoint", "status", "-w", "json"],
                       env=dict(os.environ, ETCDCTL_API="3"), capture_output=True, text=True, check=True)
    return json.loads(p.stdout)[0]["Status"]["header"]["revision"]


def port_free(port=2379):
    with socket.socket() as s:
        return s.connect_ex((IP, port)) != 0


def answer_of(etcd, flags, what, f):
    """Starts etcd with `flags`, returns f() once it answers: only from this etcd (the client port
    was free before it started, and it is still running after the answer), never from a stray one."""
    if not port_free():
        raise SystemExit(f"something already listens on {IP}:2379; {what} would not be checked")
    e = subprocess.Popen([etcd, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        got = poll(what, lambda: e.poll() is None and f(), timeout=120)
        if e.poll() is not None:
            raise SystemExit(f"{what}: the etcd started on it exited ({e.returncode})")
        return got
    finally:
        e.terminate(); e.wait()


def poll(what, f, timeout=600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = f()
            if v:
                return v
        except Exception:
            pass
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--etcd", required=True)
    ap.add_argument("--warden", default="target/release/etcd-warden")
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--revisions", type=int, default=100000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-replay", action="store_true", help="skip the through-etcd comparison")
    ap.add_argument("--keep", help="a directory to prepare the data in once, and to reuse")
    ap.add_argument("--compare", help="another etcd-warden binary, timed (and checked) beside --warden, each first in turn")
    a = ap.parse_args()
    bindir = os.path.dirname(a.etcd)
    ctl = os.path.join(bindir, "etcdctl")
    if a.keep:
        tmp = os.path.abspath(a.keep)
        os.makedirs(tmp, exist_ok=True)
    else:
        tmp = tempfile.mkdtemp(prefix="warden-restore-", dir="/var/tmp")
    prepared = os.path.join(tmp, "prepared.json")
    data, store = os.path.join(tmp, "data"), f"file://{tmp}/store"
    etcd_flags = ["--name", "m1", "--data-dir", data,
                  "--listen-client-urls", f"http://{IP}:2379", "--advertise-client-urls", f"http://{IP}:2379",
                  "--listen-peer-urls", f"http://{IP}:2380", "--initial-advertise-peer-urls", f"http://{IP}:2380",
                  "--initial-cluster", f"m1=http://{IP}:2380", "--log-level", "error",
                  "--quota-backend-bytes", str(8 << 30)]
    try:
        if os.path.exists(prepared):
            with open(prepared) as f:
                base, final, want = json.load(f)
            snap = os.path.join(tmp, "final.db")
            print(f"reusing {tmp}", file=sys.stderr)
        else:
            base, final, want, snap = prepare(a, tmp, store, etcd_flags, ctl, bindir)
            if a.keep:
                with open(prepared, "w") as f:
                    json.dump([base, final, want], f)
        run(a, tmp, store, etcd_flags, ctl, bindir, base, final, want, snap)
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)


def prepare(a, tmp, store, etcd_flags, ctl, bindir):
    # 1. A ~1 GiB DB, written without the warden.
    e = subprocess.Popen([a.etcd, *etcd_flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    poll("etcd for the fill", lambda: e.poll() is None and revision(ctl), timeout=60)
    print(subprocess.run(["target/release/examples/fill", f"http://{IP}:2379", str(a.mib)],
                         capture_output=True, text=True, check=True).stdout.strip(), file=sys.stderr)
    e.terminate(); e.wait()
    # 2. The warden takes the full snapshot, then the load makes the delta revisions.
    w = subprocess.Popen([a.warden, "run", "--listen", f"{IP}:2378", "--store", store,
                          "--delta-snapshot-period", "2s", "--", a.etcd, *etcd_flags],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, RUST_LOG="warn"))
    try:
        return load_and_snapshot(a, tmp, ctl, bindir)
    finally:
        # Also when the load fails (a full quota, say): no warden left behind on a removed dir.
        w.terminate(); w.wait()


def load_and_snapshot(a, tmp, ctl, bindir):
    poll("the full snapshot", lambda: status()["backup"]["fulls_total"] >= 1)
    base = status()["backup"]["last_full"]["revision"]
    # Write until the deltas hold the requested number of revisions (a delete of an absent key makes
    # none, so count etcd's revisions, not the writes).
    made = 0
    while made < a.revisions:
        seconds = max(2, min(30, (a.revisions - made) // 8000 + 1))
        out = subprocess.run(["target/release/examples/load", f"http://{IP}:2379", str(seconds), "32"],
                             capture_output=True, text=True, check=True).stdout.strip()
        print(out, file=sys.stderr)
        made = revision(ctl) - base
    # The load has stopped: etcd's own revision (not the warden's view of it, which lags by a health
    # interval) is what the store must reach, and exactly.
    final = revision(ctl)
    poll("the store to catch up", lambda: status()["backup"]["backed_up_revision"] >= final)
    if status()["backup"]["backed_up_revision"] != final:
        raise SystemExit(f"the store is at {status()['backup']['backed_up_revision']}, etcd at {final}")
    want = hashkv(ctl, final)
    snap = os.path.join(tmp, "final.db")
    subprocess.run([os.path.join(bindir, "etcdctl"), f"--endpoints=http://{IP}:2379", "snapshot", "save", snap],
                   env=dict(os.environ, ETCDCTL_API="3"), capture_output=True, check=True)
    print(f"store: full at {base}, deltas to {final} ({final - base} revisions); final DB {os.path.getsize(snap) >> 20} MiB",
          file=sys.stderr)
    return base, final, want, snap


def run(a, tmp, store, etcd_flags, ctl, bindir, base, final, want, snap):
    member_flags = ["--name", "m1", "--initial-cluster", f"m1=http://{IP}:2380",
                    "--initial-advertise-peer-urls", f"http://{IP}:2380", "--etcd", a.etcd]
    # An exact copy, as etcdutl restores without flags (restore's default raises the revision).
    restore_flags = [*member_flags, "--bump-revision", "0"]

    def check(out):
        """etcd on the restored dir holds the original history, byte for byte."""
        got, rev = answer_of(a.etcd, [*etcd_flags[:2], "--data-dir", out, *etcd_flags[4:]],
                             "etcd on the restored dir", lambda: (hashkv(ctl, final), revision(ctl)))
        if rev != final:
            raise SystemExit(f"restored {out}: etcd serves revision {rev}, the store's last is {final}")
        if got != want:
            raise SystemExit(f"restored {out}: HashKV at {final} is {got}, the original's is {want}")

    res = {"warden": [], "bumped": [], "etcdutl": [], "replay": [], "compare": []}
    rss = {"warden": [], "bumped": [], "etcdutl": [], "replay": [], "compare": []}
    bump_secs = []
    tree = []
    for r in range(a.rounds):
        # With --compare, the two binaries take turns going first (A B, B A, ...): the page cache and
        # the disk's writeback favour neither.
        order = [("warden", a.warden, "w")] + ([("compare", a.compare, "c")] if a.compare else [])
        for key, binary, tag in (order if r % 2 == 0 else order[::-1]):
            out = os.path.join(tmp, f"{tag}{r}")
            t, m, whole = timed_sampled([binary, "restore", "--store", store, "--data-dir", out, *restore_flags],
                                        env=dict(os.environ, RUST_LOG="warn"))
            res[key].append(t); rss[key].append(m)
            if key == "warden":
                tree.append(whole)
            if r == 0:
                check(out)
            shutil.rmtree(out)
        # The same with the revision bump an automatic restore does (--restore-bump-revision).
        out = os.path.join(tmp, f"b{r}")
        p = subprocess.run(["/usr/bin/time", "-f", "@@%e %M", a.warden, "restore", "--store", store, "--data-dir", out,
                            *member_flags, "--bump-revision", "1000000000"],
                           env=dict(os.environ, RUST_LOG="info"), capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"bumped restore failed: {p.stderr[-3000:]}")
        wall, peak = [l for l in p.stderr.splitlines() if l.startswith("@@")][-1][2:].split()
        res["bumped"].append(float(wall)); rss["bumped"].append(int(peak) / 1024.0)
        for line in p.stderr.splitlines():
            if "revision bumped" in line and "secs=" in line:
                bump_secs.append(float(line.split("secs=")[1].split()[0]))
        if r == 0:
            got = answer_of(a.etcd, [*etcd_flags[:2], "--data-dir", out, *etcd_flags[4:]],
                            "etcd on the bumped restore", lambda: revision(ctl))
            if got != final + 1000000000:
                raise SystemExit(f"bumped restore serves revision {got}, want {final + 1000000000}")
        shutil.rmtree(out)
        out = os.path.join(tmp, f"u{r}")
        t, m, _ = timed([os.path.join(bindir, "etcdutl"), "snapshot", "restore", snap, "--data-dir", out,
                         "--name", "m1", "--initial-cluster", f"m1=http://{IP}:2380",
                         "--initial-advertise-peer-urls", f"http://{IP}:2380"])
        res["etcdutl"].append(t); rss["etcdutl"].append(m)
        shutil.rmtree(out)
    if not a.no_replay:
        out = os.path.join(tmp, "replay")
        t, m, _ = timed_sampled([a.warden, "restore", "--store", store, "--data-dir", out, *restore_flags],
                                env=dict(os.environ, RUST_LOG="warn", ETCD_WARDEN_RESTORE_THROUGH_ETCD="1"))
        res["replay"].append(t); rss["replay"].append(m)
        check(out)
        shutil.rmtree(out)
    mw, mu = statistics.median(res["warden"]), statistics.median(res["etcdutl"])
    print(f"restore benchmark ({a.rounds} rounds A B, medians): full snapshot at revision {base} "
          f"+ {final - base} delta revisions; restored HashKV = original's ({want})")
    print(f"  etcdutl snapshot restore (final DB, no deltas)   {mu:7.2f}s   peak RSS {max(rss['etcdutl']):6.1f} MiB")
    print(f"  etcd-warden restore (full + all deltas)          {mw:7.2f}s   peak RSS {max(rss['warden']):6.1f} MiB"
          f"   ratio {mw / mu:.2f}x")
    print(f"    (largest process in the restore tree: {max(tree):.1f} MiB)")
    mb = statistics.median(res["bumped"])
    print(f"  same with --bump-revision 1e9 --mark-compacted   {mb:7.2f}s   peak RSS {max(rss['bumped']):6.1f} MiB (with etcdutl)"
          f"   ratio {mb / mu:.2f}x; the bump itself {1000 * max(bump_secs or [0]):.1f} ms (max of {len(bump_secs)})")
    if res["compare"]:
        mc = statistics.median(res["compare"])
        print(f"  {a.compare} (full + all deltas) {mc:7.2f}s   peak RSS {max(rss['compare']):6.1f} MiB"
              f"   ratio {mc / mu:.2f}x (rounds {', '.join(f'{x:.2f}' for x in res['compare'])}; "
              f"--warden rounds {', '.join(f'{x:.2f}' for x in res['warden'])})")
    if res["replay"]:
        mr = res["replay"][0]
        print(f"  same, deltas replayed through a private etcd     {mr:7.2f}s   peak RSS {rss['replay'][0]:6.1f} MiB"
              f"   ratio {mr / mu:.2f}x (1 run)")


if __name__ == "__main__":
    main()
