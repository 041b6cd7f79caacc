//! The store as hostile (issue 41): whoever can write one object into the bucket must not be able
//! to take etcd down or make the warden restore forged data. Each test plants what a review
//! planted, with the real binary.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::Read;
use std::process::Command;
use std::time::Duration;

use common::objects::*;
use common::*;

const START: Duration = Duration::from_secs(60);

/// A warden with `opts` and a file store under `dir`: a write, a second full by SIGUSR1, five
/// writes in that chain's deltas, every one in the store; then the node lost. The store's URL and
/// etcd's last revision.
fn two_chains(etcd: &std::path::Path, ip: &str, dir: &std::path::Path, opts: &[&str]) -> (String, i64) {
    let ctl = etcdctl_for(etcd);
    let (w, store) = warden_with_file_store(etcd, ip, dir, opts);
    etcdctl(&ctl, ip, &["put", "old", "1"]).unwrap();
    let fulls = w.status()["backup"]["fulls_total"].as_u64().unwrap();
    w.signal(nix::sys::signal::Signal::SIGUSR1);
    wait_for("a second full snapshot", START, || {
        (w.status()["backup"]["fulls_total"].as_u64() > Some(fulls)).then_some(())
    });
    for i in 0..5 {
        etcdctl(&ctl, ip, &["put", &format!("new{i}"), "v"]).unwrap();
    }
    let rev = etcd_revision(&ctl, ip);
    wait_for(&format!("revision {rev} in the store"), START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(rev)).then_some(())
    });
    kill_node(w, START);
    (store, rev)
}

/// A delta payload (uncompressed) of one revision `rev` that puts `forged` = `evil`.
fn forged_put(rev: i64) -> Vec<u8> {
    use etcd_warden::format::delta_codec::{Event, EventType, Revision, encode_revision};
    let mut payload = Vec::new();
    let event = Event {
        kind: EventType::Put,
        key: b"forged".to_vec(),
        value: b"evil".to_vec(),
        lease: 0,
        create_revision: rev,
        version: 1,
    };
    encode_revision(
        &Revision {
            revision: rev,
            events: vec![event],
        },
        &mut payload,
    );
    payload
}

/// A 0-byte object whose name carries a multi-byte character where a digit belongs: the name
/// parser sliced it by byte index and aborted every command that lists the store (a running
/// `run` with its etcd, and every restart before etcd starts). Now it is no snapshot, and said so.
#[test]
fn a_name_with_a_multibyte_character_takes_nothing_down() {
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let (w, store) = warden_with_file_store(&default_etcd(), &ip, dir.path(), &[]);
    let hostile = dir
        .path()
        .join("store/v1/full/full-00000000000000000099-202é204T215500000Z-zstd-plain.ews");
    std::fs::write(&hostile, b"").unwrap();

    let out = Command::new(WARDEN)
        .args(["backups", "list", "--json", "--store", &store])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "backups list: {stderr}");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        rows.as_array()
            .is_some_and(|r| r.iter().any(|r| r["kind"] == "full")),
        "the real full is not listed: {rows}"
    );

    // The running warden lists the store again at its next full: it and its etcd live on.
    let fulls = w.status()["backup"]["fulls_total"].as_u64().unwrap();
    w.signal(nix::sys::signal::Signal::SIGUSR1);
    wait_for("a full snapshot after the object was planted", START, || {
        w.assert_running();
        (w.status()["backup"]["fulls_total"].as_u64() > Some(fulls)).then_some(())
    });
    w.wait_ready(START);

    // A start with the data dir lost restores the real backups.
    let etcd_pid = w.etcd_pid().unwrap();
    let mut w = w;
    w.signal(nix::sys::signal::Signal::SIGKILL);
    w.wait_exit(START);
    wait_for("etcd to die with its warden", START, || {
        (!alive(etcd_pid)).then_some(())
    });
    std::fs::remove_dir_all(dir.path().join("data")).unwrap();
    let mut argv = vec![default_etcd().display().to_string()];
    argv.extend(etcd_args(&ip, &dir.path().join("data")));
    let w = Warden::start(&ip, &["--store", &store], &argv);
    w.wait_ready(START);
    assert_eq!(
        w.status()["restore"]["startup_restores"]["total"],
        1,
        "{}",
        w.log_text()
    );
}

/// Finding 6: `backups verify --kube-encryption-config` wrote the decrypted full to
/// `$TMPDIR/etcd-warden-kube-keys-<pid>.db` with a plain create, so another local user could plant
/// a symlink there and have the warden overwrite any file, or read the database. The scratch file
/// now lives in a fresh 0700 directory under a name nobody can guess.
#[test]
fn verify_with_a_kube_encryption_config_never_writes_through_a_planted_name() {
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let (w, store) = warden_with_file_store(&default_etcd(), &ip, dir.path(), &[]);
    drop(w);
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "untouched").unwrap();
    let config = dir.path().join("encryption.yaml");
    std::fs::write(
        &config,
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - aescbc:\n      keys:\n      - name: key1\n        secret: a2V5MS0tLS0tLS0tLS0tLS0tLS0tLS0tLS0tLS0tLS0=\n  - identity: {}\n",
    )
    .unwrap();
    // The shell plants the symlink at the name its own pid gives, then becomes the warden.
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"ln -s "$VICTIM" "$TMPDIR/etcd-warden-kube-keys-$$.db" && exec "$WARDEN" backups verify --store "$STORE" --kube-encryption-config "$CONFIG""#)
        .env("VICTIM", &victim)
        .env("TMPDIR", &tmp)
        .env("WARDEN", WARDEN)
        .env("STORE", &store)
        .env("CONFIG", &config)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("no value encrypted at rest"), "{said}");
    let victim_now = std::fs::read(&victim).unwrap();
    assert!(
        victim_now == b"untouched",
        "the warden wrote {} bytes through a name another user planted: {said}",
        victim_now.len()
    );
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left.len(), 1, "only the planted link is left: {left:?}");
}

/// Issue 41 finding 7: thousands of half-open HTTP connections took every descriptor of a warden
/// with an ordinary limit (here 512): /readyz went silent, `ctl` got no answer and deltas failed
/// with EMFILE. Now a listener serves a bounded number of connections, the oldest closed first,
/// and headers must arrive in time: while 4 000 idle connections are held, /readyz answers, the
/// admin socket answers, and a write still reaches the store.
#[test]
fn four_thousand_idle_connections_leave_readyz_ctl_and_backups_working() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    assert!(
        hard >= 8192,
        "the test needs 4 000 descriptors of its own (hard limit {hard})"
    );

    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let socket = dir.path().join("admin.sock");
    let socket_arg = socket.display().to_string();
    let etcd = default_etcd();
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(&ip, &dir.path().join("data")));
    let opts = [
        "--store",
        store.as_str(),
        "--delta-snapshot-period",
        "200ms",
        "--admin-socket",
        socket_arg.as_str(),
    ];
    let w = Warden::builder_with(&["prlimit", "--nofile=512:512", "--"], &ip, &opts, &argv).spawn();
    w.wait_ready(START);

    let mut held = Vec::new();
    for _ in 0..4000 {
        // Some are closed by the warden as newer ones arrive; holding the rest is the point.
        if let Ok(s) = std::net::TcpStream::connect(&w.http) {
            held.push(s);
        }
    }
    assert!(held.len() > 3000, "only {} connections opened", held.len());
    wait_for(
        "/readyz 200 while 4 000 idle connections are held",
        Duration::from_secs(10),
        || (w.get("/readyz")?.0 == 200).then_some(()),
    );
    let out = Command::new(WARDEN)
        .args(["ctl", "--admin-socket", &socket_arg, "status"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ctl status on the admin socket: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ctl = etcdctl_for(&etcd);
    etcdctl(&ctl, &ip, &["put", "during-the-flood", "v"]).unwrap();
    let rev = etcd_revision(&ctl, &ip);
    wait_for(
        &format!("revision {rev} in the store during the flood"),
        START,
        || (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(rev)).then_some(()),
    );
    let log = w.log_text();
    assert!(
        !log.contains("Too many open files"),
        "the warden ran out of descriptors:\n{log}"
    );
    drop(held);
}

/// Issue 41 finding 9: the store's cloud credentials reached the environment of etcd and of
/// etcdutl. Neither sees them now: etcd's /proc environ while it runs, and etcdutl's environment
/// as a wrapper beside etcd records it during a start-up restore.
#[test]
fn cloud_credentials_reach_neither_etcd_nor_etcdutl() {
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let real = default_etcd();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(&real, bin.join("etcd")).unwrap();
    let seen = dir.path().join("etcdutl.env");
    let wrapper = format!(
        "#!/bin/sh\nenv > '{}'\nexec '{}' \"$@\"\n",
        seen.display(),
        real.with_file_name("etcdutl").display()
    );
    std::fs::write(bin.join("etcdutl"), wrapper).unwrap();
    std::fs::set_permissions(
        bin.join("etcdutl"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let secrets = [
        ("AWS_SECRET_ACCESS_KEY", "aws-secret-9f1c"),
        ("AZURE_STORAGE_ACCOUNT_KEY", "azure-secret-77ab"),
        ("GOOGLE_SERVICE_ACCOUNT_KEY", "google-secret-31d0"),
    ];
    let data = dir.path().join("data");
    let store = format!("file://{}", dir.path().join("store").display());
    let mut argv = vec![bin.join("etcd").display().to_string()];
    argv.extend(etcd_args(&ip, &data));
    let opts = ["--store", store.as_str(), "--delta-snapshot-period", "200ms"];
    let start = || {
        let mut b = Warden::builder(&ip, &opts, &argv);
        for (k, v) in secrets {
            b = b.env(k, v);
        }
        let w = b.spawn();
        w.wait_ready(START);
        w
    };
    let w = start();
    wait_for("the first full snapshot", START, || {
        (w.status()["backup"]["fulls_total"].as_u64() >= Some(1)).then_some(())
    });
    let environ = std::fs::read(format!("/proc/{}/environ", w.etcd_pid().unwrap())).unwrap();
    let environ = String::from_utf8_lossy(&environ).replace('\0', "\n");
    for (k, v) in secrets {
        assert!(!environ.contains(v), "{k} reached etcd's environment:\n{environ}");
    }
    kill_node(w, START);
    std::fs::remove_dir_all(&data).unwrap();
    let w = start();
    let env = std::fs::read_to_string(&seen)
        .unwrap_or_else(|e| panic!("etcdutl never ran for the restore ({e}):\n{}", w.log_text()));
    for (k, v) in secrets {
        assert!(!env.contains(v), "{k} reached etcdutl's environment:\n{env}");
    }
}

/// Every file and directory under `root` (itself included) whose mode lets group or others in.
fn not_private(root: &std::path::Path) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let meta = std::fs::symlink_metadata(&p).unwrap();
        if meta.file_type().is_symlink() {
            continue;
        }
        if meta.permissions().mode() & 0o077 != 0 {
            out.push(format!("{:o} {}", meta.permissions().mode() & 0o777, p.display()));
        }
        if meta.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
        }
    }
    out
}

/// Issue 41 finding 8: the default store beside the data dir (the kubeadm layout of
/// docs/kubernetes.md), its objects and a restore's data were readable by every local user.
/// Everything the warden writes is its user's alone now (0600 files, 0700 directories), whatever
/// the umask it was started with.
#[test]
fn the_store_and_restored_data_are_readable_by_their_owner_only() {
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let etcd = default_etcd();
    let data = dir.path().join("data");
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(&ip, &data));
    let w = Warden::builder_with(
        &["sh", "-c", "umask 022 && exec \"$@\"", "sh"],
        &ip,
        &["--delta-snapshot-period", "200ms"],
        &argv,
    )
    .spawn();
    w.wait_ready(START);
    let ctl = etcdctl_for(&etcd);
    etcdctl(&ctl, &ip, &["put", "/registry/secrets/a", "s3cret"]).unwrap();
    let rev = etcd_revision(&ctl, &ip);
    wait_for(&format!("revision {rev} in the store"), START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(rev)).then_some(())
    });
    kill_node(w, START);
    let store_dir = dir.path().join("data.backups");
    assert!(
        store_dir.join("v1").is_dir(),
        "the default store beside the data dir"
    );
    let open = not_private(&store_dir);
    assert!(
        open.is_empty(),
        "store entries others can read:\n{}",
        open.join("\n")
    );

    let restored = dir.path().join("restored");
    let ip2 = unique_ip();
    let store = format!("file://{}", store_dir.display());
    let out = restore_command_bumped(&store, &restored, &etcd, &ip2, &[])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let open = not_private(&restored);
    assert!(
        open.is_empty(),
        "restored entries others can read:\n{}",
        open.join("\n")
    );
}

/// Issue 41 finding 4: a compression bomb under a newer full's name (a small zstd payload that
/// decompresses to 256 MiB, its footer claiming 20 KiB) filled the disk of the restore: the bytes
/// were counted against the claim only at the end. Now the stream stops at the footer's claim, the
/// object is corrupt, and the restore falls back to the genuine older full, on a file system
/// (a 96 MiB tmpfs) the bomb would have filled.
#[test]
fn a_compression_bomb_is_stopped_at_its_claim_and_the_restore_falls_back() {
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let etcd = default_etcd();
    let (w, store) = warden_with_file_store(&etcd, &ip, dir.path(), &[]);
    let ctl = etcdctl_for(&etcd);
    etcdctl(&ctl, &ip, &["put", "genuine", "v"]).unwrap();
    let rev = etcd_revision(&ctl, &ip);
    wait_for(&format!("revision {rev} in the store"), START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(rev)).then_some(())
    });
    kill_node(w, START);

    // The bomb: a genuine full's header, a forged payload, footer and trailer (an attacker can
    // compute the digest of what they write).
    let fulls = dir.path().join("store/v1/full");
    let genuine = std::fs::read_dir(&fulls)
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    // Its header says what its name says: it is read as far as its payload.
    let mut header = header_of(&genuine);
    header["revision"] = (rev + 1000).into();
    header["created"] = "2099-12-31T00:00:00.000Z".into();
    let payload = zstd::encode_all(std::io::repeat(0).take(256 << 20), 19).unwrap();
    let bomb = framed(&header, &payload, &serde_json::json!({"raw_bytes": 20480}));
    let bomb_name = format!("full-{:020}-20991231T000000000Z-zstd-plain.ews", rev + 1000);
    std::fs::write(fulls.join(&bomb_name), &bomb).unwrap();
    assert!(bomb.len() < 1 << 20, "the bomb is small: {} bytes", bomb.len());

    let small = dir.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let restored = small.join("data");
    let ip2 = unique_ip();
    let script = format!(
        "mount -t tmpfs -o size=96m tmpfs '{}' && exec \"$@\"",
        small.display()
    );
    let mut restore = restore_command_bumped(&store, &restored, &etcd, &ip2, &[]);
    // The older full is all the store truly has: take it.
    restore.arg("--accept-older");
    let inner: Vec<String> = std::iter::once(restore.get_program().to_string_lossy().into_owned())
        .chain(restore.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect();
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script, "sh"])
        .args(&inner)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the restore failed:\n{said}");
    assert!(
        said.contains(&bomb_name) && said.contains("decompresses past"),
        "the bomb is not named as corrupt:\n{said}"
    );
    assert!(
        !said.contains("No space left"),
        "the bomb filled the file system:\n{said}"
    );
}

/// With encryption on, whoever can write to the bucket (and knows the public recipient) planted
/// what a review planted: a genuine old encrypted full copied to a newer name, a key that claims
/// age over a plain header, and an unencrypted delta that extends the newest chain with a forged
/// write. `backups verify --identity-file` names each; a restore of an empty data dir refuses them
/// all and restores the genuine newest chain, as etcd held it; the operator can accept an
/// unencrypted object by name.
#[test]
fn forged_and_renamed_objects_in_an_encrypted_store_are_refused() {
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let key = dir.path().join("key.txt");
    let out = Command::new("age-keygen").arg("-o").arg(&key).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new("age-keygen").arg("-y").arg(&key).output().unwrap();
    let recipient = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let (store, rev) = two_chains(&etcd, &ip, dir.path(), &["--encrypt-to", &recipient]);

    let listed = backups_list(&store, &[]);
    let oldest_full = listed
        .iter()
        .filter(|o| o["kind"] == "full")
        .min_by_key(|o| o["first"].as_i64())
        .unwrap()["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let newest_delta = listed
        .iter()
        .filter(|o| o["kind"] == "delta")
        .max_by_key(|o| o["last"].as_i64())
        .unwrap()
        .clone();
    let root = dir.path().join("store");
    // `backups list` names objects by their keys, relative to the store's root.
    let store_path = |k: &str| root.join(k);
    // 1. The genuine old full under a newer name.
    let renamed = format!("full-{:020}-20991231T000000000Z-zstd-age.ews", rev + 100);
    std::fs::copy(store_path(&oldest_full), root.join("v1/full").join(&renamed)).unwrap();
    // 2. A key that claims age over an object whose header (genuinely) says plain.
    let mut plain_header = header_of(&store_path(&oldest_full));
    plain_header["revision"] = (rev + 200).into();
    plain_header["created"] = "2099-12-31T00:00:01.000Z".into();
    plain_header["encryption"] = "plain".into();
    let claimed_age = format!("full-{:020}-20991231T000000001Z-zstd-age.ews", rev + 200);
    std::fs::write(
        root.join("v1/full").join(&claimed_age),
        framed(&plain_header, b"", &serde_json::json!({"raw_bytes": 0})),
    )
    .unwrap();
    // 3. An unencrypted delta after the newest, whose header agrees with its name.
    let delta_key = newest_delta["key"].as_str().unwrap();
    let mut header = header_of(&store_path(delta_key));
    let (first, last) = (rev + 1, rev + 1);
    header["first"] = first.into();
    header["last"] = last.into();
    header["created"] = "2099-12-31T00:00:02.000Z".into();
    header["compression"] = "none".into();
    header["encryption"] = "plain".into();
    let payload = forged_put(first);
    let forged_name = format!("delta-{first:020}-{last:020}-20991231T000000002Z-none-plain.ews");
    let chain_dir = store_path(delta_key).parent().unwrap().to_owned();
    std::fs::write(
        chain_dir.join(&forged_name),
        framed(
            &header,
            &payload,
            &serde_json::json!({"raw_bytes": payload.len(), "revisions": 1, "events": 1}),
        ),
    )
    .unwrap();

    let key_s = key.display().to_string();
    let verify = |allow: &[&str]| {
        let out = Command::new(WARDEN)
            .args(["backups", "verify", "--store", &store, "--identity-file", &key_s])
            .args(allow)
            .output()
            .unwrap();
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (code, said) = verify(&[]);
    assert_ne!(code, Some(0), "verify passed a planted object:\n{said}");
    for (planted, why) in [
        (&renamed, "disagrees with its name"),
        (&claimed_age, "disagrees with its name"),
        (&forged_name, "is not encrypted"),
    ] {
        assert!(
            said.lines()
                .any(|l| l.contains(planted.as_str()) && l.contains(why)),
            "verify does not report {planted} ({why}):\n{said}"
        );
    }
    let forged_key = format!("{}/{forged_name}", delta_key.rsplit_once('/').unwrap().0);
    let allow = format!("--allow-unencrypted={forged_key}");
    let (_, said) = verify(&[&allow]);
    assert!(
        !said
            .lines()
            .any(|l| l.contains(&forged_name) && l.contains("is not encrypted")),
        "an unencrypted object named in --allow-unencrypted is still refused:\n{said}"
    );

    // A restore of an empty data dir: the genuine newest chain, not the renamed old full, and
    // not the forged write.
    let restored = dir.path().join("restored");
    let ip2 = unique_ip();
    let out = restore_command(&store, &restored, &etcd, &ip2, &[])
        .args(["--identity-file", &key_s])
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        restored.join("member/snap/db").exists(),
        "nothing restored:\n{said}"
    );
    assert!(
        said.contains(&renamed),
        "the restore does not say why it skipped {renamed}:\n{said}"
    );
    let plain = PlainEtcd::start(&etcd, &ip2, &restored, "m1");
    assert_eq!(
        etcd_revision(&ctl, &ip2),
        rev,
        "the restore is not the genuine newest chain:\n{said}"
    );
    assert_eq!(
        etcdctl(&ctl, &ip2, &["get", "forged"]).unwrap(),
        "",
        "the forged write was restored"
    );
    assert!(
        etcdctl(&ctl, &ip2, &["get", "new4", "--print-value-only"])
            .unwrap()
            .contains('v'),
        "the genuine newest write is missing"
    );
    plain.stop();
}

/// An object at `path` with `header` in place of its own: payload and footer (and the footer's
/// signature) byte for byte.
/// A plain (unencrypted) store whose objects the warden signs (`--sign-key`): whoever can write
/// to the bucket cannot add a write (an unsigned delta), roll the restore back (a genuine old
/// full under a newer name with a header edited to agree), or pass off objects under a key the
/// reader does not trust. `backups verify` and `restore` with the public key refuse each and say
/// why; the restore is the genuine newest chain.
#[test]
fn a_signed_store_refuses_forged_renamed_and_foreign_objects() {
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let (sign, verify_key) = ed25519(dir.path(), "sign");
    let (_, foreign) = ed25519(dir.path(), "foreign");
    let (store, rev) = two_chains(&etcd, &ip, dir.path(), &["--sign-key", &sign]);

    let listed = backups_list(&store, &[]);
    let oldest_full = listed
        .iter()
        .filter(|o| o["kind"] == "full")
        .min_by_key(|o| o["first"].as_i64())
        .unwrap()["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let newest_delta = listed
        .iter()
        .filter(|o| o["kind"] == "delta")
        .max_by_key(|o| o["last"].as_i64())
        .unwrap()["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let root = dir.path().join("store");
    // 1. The genuine old full under a newer name, its header edited to agree with the name.
    let mut header = header_of(&root.join(&oldest_full));
    header["revision"] = (rev + 100).into();
    header["created"] = "2099-12-31T00:00:00.000Z".into();
    let renamed = format!("full-{:020}-20991231T000000000Z-zstd-plain.ews", rev + 100);
    std::fs::write(
        root.join("v1/full").join(&renamed),
        reframed(&root.join(&oldest_full), &header),
    )
    .unwrap();
    // 2. An unsigned delta after the newest, whose header agrees with its name.
    let mut header = header_of(&root.join(&newest_delta));
    let first = rev + 1;
    header["first"] = first.into();
    header["last"] = first.into();
    header["created"] = "2099-12-31T00:00:00.002Z".into();
    header["compression"] = "none".into();
    let payload = forged_put(first);
    let forged = format!("delta-{first:020}-{first:020}-20991231T000000002Z-none-plain.ews");
    let chain_dir = root.join(&newest_delta).parent().unwrap().to_owned();
    std::fs::write(
        chain_dir.join(&forged),
        framed(
            &header,
            &payload,
            &serde_json::json!({"raw_bytes": payload.len(), "revisions": 1, "events": 1}),
        ),
    )
    .unwrap();

    let verify = |args: &[&str]| {
        let out = Command::new(WARDEN)
            .args(["backups", "verify", "--store", &store])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let verify_arg = format!("--verify-key={verify_key}");
    let (code, said) = verify(&[&verify_arg]);
    assert_ne!(code, Some(0), "verify passed a planted object:\n{said}");
    for (planted, why) in [(&renamed, "does not match"), (&forged, "it is not signed")] {
        assert!(
            said.lines()
                .any(|l| l.contains(planted.as_str()) && l.contains(why)),
            "verify does not report {planted} ({why}):\n{said}"
        );
    }
    assert!(
        !said
            .lines()
            .any(|l| l.starts_with("FAIL") && (l.contains(&oldest_full) || l.contains(&newest_delta))),
        "verify refuses a genuine signed object:\n{said}"
    );
    // Read with a key that signed nothing here: every object is refused, by name of its key.
    let (code, said) = verify(&[&format!("--verify-key={foreign}")]);
    assert_ne!(code, Some(0), "{said}");
    assert!(
        said.lines()
            .any(|l| l.starts_with("FAIL") && l.contains(&oldest_full) && l.contains("not trusted here")),
        "an object signed by another key is not refused as such:\n{said}"
    );
    // An unsigned object the operator names is accepted.
    let forged_key = format!("{}/{forged}", newest_delta.rsplit_once('/').unwrap().0);
    let (_, said) = verify(&[&verify_arg, &format!("--allow-unsigned={forged_key}")]);
    assert!(
        !said
            .lines()
            .any(|l| l.contains(&forged) && l.contains("it is not signed")),
        "an unsigned object named in --allow-unsigned is still refused:\n{said}"
    );

    // A restore of an empty data dir with the public key: the genuine newest chain.
    let restored = dir.path().join("restored");
    let ip2 = unique_ip();
    let out = restore_command(&store, &restored, &etcd, &ip2, &[])
        .arg(&verify_arg)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        restored.join("member/snap/db").exists(),
        "nothing restored:\n{said}"
    );
    assert!(
        said.contains(&renamed),
        "the restore does not say why it skipped {renamed}:\n{said}"
    );
    let plain = PlainEtcd::start(&etcd, &ip2, &restored, "m1");
    assert_eq!(
        etcd_revision(&ctl, &ip2),
        rev,
        "the restore is not the genuine newest chain:\n{said}"
    );
    assert_eq!(
        etcdctl(&ctl, &ip2, &["get", "forged"]).unwrap(),
        "",
        "the forged write was restored"
    );
    plain.stop();

    // 3. A cluster restore plan nobody signed, pending: members would restore the old full by it.
    // A warden that signs (here `cluster restore` itself) does not believe it; its own plan is
    // signed.
    let plans = root.join("v1/cluster-restore");
    std::fs::create_dir_all(&plans).unwrap();
    let forged_plan = serde_json::json!({"format": 1, "id": "20991231T000000000Z", "created_ms": 1,
        "full": oldest_full, "target_revision": 1, "bump_revision": 0, "token": "evil",
        "members": [{"name": "m1", "peer_urls": [format!("http://{ip}:2380")]}],
        "previous_cluster_id": 0, "force": true});
    std::fs::write(plans.join("current.json"), forged_plan.to_string()).unwrap();
    let cluster_restore = |extra: &[&str]| {
        let out = Command::new(WARDEN)
            .args(["cluster", "restore", "--store", &store, "--initial-cluster"])
            .arg(format!("m1=http://{ip}:2380"))
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (code, said) = cluster_restore(&[]);
    assert_eq!(
        code,
        Some(64),
        "without signing, the planted plan is pending:\n{said}"
    );
    let (code, said) = cluster_restore(&["--sign-key", &sign]);
    assert_eq!(
        code,
        Some(0),
        "the signing cluster restore believed the planted plan:\n{said}"
    );
    let current = std::fs::read_to_string(plans.join("current.json")).unwrap();
    assert!(
        current.contains("\"signature\":\"ed25519:") && !current.contains("evil"),
        "the new plan is not the signed one: {current}"
    );
}

/// A full whose database is crafted, with the sha256 that anyone who can write to an unsigned
/// bucket can compute for it (its root page claims 65 535 elements): the warden's own bbolt reader
/// finds the database unsound (before etcd's tool restores the seed; where the tool takes a full
/// whole, after it failed under a memory and time bound), and the restore falls back to the older
/// chain, naming the crafted full, instead of stopping there.
#[test]
fn a_crafted_database_with_a_matching_sha256_makes_the_restore_fall_back() {
    use etcd_warden::snapshot::full::upload_stream;
    use etcd_warden::snapshot::verify::read_full_to_file;
    use etcd_warden::store::format::Footer;
    use sha2::{Digest, Sha256};

    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let etcd = default_etcd();
    let ctl = etcdctl_for(&etcd);
    let (w, store) = warden_with_file_store(&etcd, &ip, dir.path(), &[]);
    etcdctl(&ctl, &ip, &["put", "old", "1"]).unwrap();
    let older_end = etcd_revision(&ctl, &ip);
    let fulls = w.status()["backup"]["fulls_total"].as_u64().unwrap();
    w.signal(nix::sys::signal::Signal::SIGUSR1);
    wait_for("a second full snapshot", START, || {
        (w.status()["backup"]["fulls_total"].as_u64() > Some(fulls)).then_some(())
    });
    etcdctl(&ctl, &ip, &["put", "new", "2"]).unwrap();
    let rev = etcd_revision(&ctl, &ip);
    wait_for(&format!("revision {rev} in the store"), START, || {
        (w.status()["backup"]["backed_up_revision"].as_i64() >= Some(rev)).then_some(())
    });
    kill_node(w, START);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let s = etcd_warden::store::Store::open(&etcd_warden::store::StoreUrl::File {
        path: dir.path().join("store"),
    })
    .unwrap();
    let fulls = rt.block_on(s.list_fulls()).unwrap();
    let newest = fulls
        .iter()
        .map(|(n, _)| *n)
        .max_by_key(|n| n.last_revision())
        .unwrap();
    let stream = dir.path().join("full.stream");
    let verified = rt
        .block_on(read_full_to_file(&s, &newest, &stream, &Default::default()))
        .unwrap();
    let mut db = std::fs::read(&stream).unwrap();
    db.truncate(db.len() - 32);
    // The meta with the higher txid names the root page; its element count goes to 65 535.
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let page_size = u32::from_le_bytes(db[24..28].try_into().unwrap()) as usize;
    let meta = [16, page_size + 16]
        .into_iter()
        .max_by_key(|&m| u64_at(&db, m + 48))
        .unwrap();
    let root = u64_at(&db, meta + 16) as usize;
    db[root * page_size + 10..root * page_size + 12].copy_from_slice(&u16::MAX.to_le_bytes());
    let sha = Sha256::digest(&db);
    db.extend_from_slice(&sha);
    std::fs::remove_file(dir.path().join("store").join(newest.key())).unwrap();
    let chunks: Vec<_> = db.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
    let (raw, sha_hex, writer) = rt
        .block_on(upload_stream(
            &s,
            &newest.key(),
            &verified.header,
            newest.compression,
            futures_util::stream::iter(chunks),
        ))
        .unwrap();
    rt.block_on(writer.finish(&Footer {
        raw_bytes: raw,
        etcd_sha256: Some(sha_hex),
        ..verified.footer.clone()
    }))
    .unwrap();

    let restored = dir.path().join("restored");
    let ip2 = unique_ip();
    let out = restore_command(&store, &restored, &etcd, &ip2, &[])
        .arg("--accept-older")
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "the restore stopped at the crafted full:\n{said}"
    );
    assert!(
        said.lines()
            .any(|l| l.contains(&newest.key()) && l.contains("corrupt bbolt file")),
        "the restore does not say why it skipped {}:\n{said}",
        newest.key()
    );
    let plain = PlainEtcd::start(&etcd, &ip2, &restored, "m1");
    assert!(
        etcd_revision(&ctl, &ip2) >= older_end,
        "the older chain was not restored:\n{said}"
    );
    assert_eq!(
        etcdctl(&ctl, &ip2, &["get", "old", "--print-value-only"])
            .unwrap()
            .trim(),
        "1",
        "the older chain's write is missing"
    );
    plain.stop();
}
