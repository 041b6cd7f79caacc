//! README's "first backup and restore", run verbatim: the ```` ```sh quick-start ```` block is
//! taken from README.md and run by bash, line by line with `set -e`, from a directory where
//! `scripts/demo` runs (etcd 3.6.16 under the warden, a local file store, as a newcomer starts it;
//! `WARDEN_BIN` hands it this test build's binary instead of a release build). Then etcd's own
//! etcdctl reads the restored data dir: the write the block made is there, and the revision was
//! raised by the default bump.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// The body of README's quick-start block.
fn quick_start_block() -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let start = readme
        .find("```sh quick-start\n")
        .expect("README.md has a ```sh quick-start block");
    let body = &readme[start + "```sh quick-start\n".len()..];
    body[..body.find("```").expect("the quick-start block ends")].to_owned()
}

#[test]
fn readme_quick_start_runs_verbatim_against_the_demo() {
    let block = quick_start_block();
    assert!(
        block.lines().count() >= 4,
        "the quick-start block is too short:\n{block}"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // A directory that looks like the repository to scripts/demo (it works from its parent dir).
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for sub in ["scripts", "builders"] {
        std::os::unix::fs::symlink(root.join(sub), d.join(sub)).unwrap();
    }
    let listen = format!("{}:2378", unique_ip());
    let log = std::fs::File::create(d.join("demo.log")).unwrap();
    let mut demo = Command::new("bash");
    demo.arg(d.join("scripts/demo"))
        .current_dir(d)
        .env("WARDEN_BIN", WARDEN)
        .env("WARDEN_LISTEN", &listen)
        .env("ETCD", "3.6")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    let mut demo = dies_with_test(&mut demo).spawn().expect("start scripts/demo");
    let demo_log = || std::fs::read_to_string(d.join("demo.log")).unwrap_or_default();
    let stop = |demo: &mut std::process::Child| {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(demo.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        wait_for(
            "the demo's warden to stop after SIGTERM",
            Duration::from_secs(40),
            || demo.try_wait().ok().flatten(),
        )
    };
    let ready = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(
            &format!("the demo's warden to answer 200 on {listen}/readyz"),
            Duration::from_secs(120),
            || matches!(http_get(&listen, "/readyz"), Some((200, _))).then_some(()),
        )
    }));
    if ready.is_err() {
        let _ = demo.kill();
        let _ = demo.wait();
        panic!("the demo did not become ready; its log:\n{}", demo_log());
    }

    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &block])
        .current_dir(d)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let status = stop(&mut demo);
    assert!(
        out.status.success(),
        "README's quick-start failed ({:?}):\n{block}\nstdout:\n{stdout}\nstderr:\n{stderr}\ndemo log:\n{}",
        out.status,
        demo_log()
    );
    assert_eq!(
        status.code(),
        Some(143),
        "the demo's warden after SIGTERM: {status:?}\n{}",
        demo_log()
    );
    assert!(
        stdout.contains("full"),
        "backups list shows no full snapshot:\n{stdout}"
    );

    // etcd's own client on the restored data dir.
    let restored = d.join("demo/restored");
    assert!(
        restored.join("member").is_dir(),
        "no data dir at {}",
        restored.display()
    );
    let etcd = d.join("demo/bin/etcd").canonicalize().unwrap();
    let ctl = etcdctl_for(&etcd);
    let ip = unique_ip();
    let plain = PlainEtcd::start(&etcd, &ip, &restored, "default");
    let value = etcdctl(&ctl, &ip, &["get", "greeting", "--print-value-only"]).unwrap();
    assert_eq!(
        value.trim(),
        "hello",
        "the restored data dir lacks the write the block made"
    );
    let revision = etcd_revision(&ctl, &ip);
    assert!(
        revision > 1_000_000_000,
        "the restore's default bump did not raise the revision: {revision}"
    );
    plain.stop();
}
