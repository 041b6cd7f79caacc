//! Bad input never starts etcd, never creates anything, and says in one line what is wrong and how
//! to fix it, with exit code 64. Plus `etcd-warden probe`.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

struct Case {
    name: &'static str,
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    want: &'static str,
}

#[test]
fn bad_input_exits_64_with_one_line_and_touches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let marker = d.join("etcd-was-started");
    let fake = d.join("fake-etcd");
    std::fs::write(
        &fake,
        format!("#!/bin/sh\ntouch {}\nexec sleep 600\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let data = d.join("data");
    let a_file = d.join("a-file");
    std::fs::write(&a_file, "not a dir").unwrap();
    let toml = d.join("bad.toml");
    std::fs::write(&toml, "stop-timout = \"5s\"\n").unwrap();
    let bad_creds = d.join("bad-creds");
    std::fs::write(&bad_creds, "AWS_ACCESS_KEY_ID\n").unwrap();
    let short_token = d.join("short-token");
    std::fs::write(&short_token, "abc\n").unwrap();
    let ip = unique_ip();
    let listen = format!("{ip}:2378");
    let busy_ip = unique_ip();
    let _busy = std::net::TcpListener::bind(format!("{busy_ip}:2378")).unwrap();

    let etcd = |extra: &[&str]| -> Vec<String> {
        let mut v = vec![
            "--".to_owned(),
            fake.display().to_string(),
            "--data-dir".into(),
            data.display().to_string(),
        ];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let with = |opts: &[&str], extra: &[&str]| -> Vec<String> {
        let mut v = vec!["run".to_owned(), "--listen".into(), listen.clone()];
        v.extend(opts.iter().map(|s| s.to_string()));
        v.extend(etcd(extra));
        v
    };
    let cases = vec![
        Case {
            name: "unknown flag",
            args: with(&["--bogus"], &[]),
            env: vec![],
            want: "--bogus",
        },
        Case {
            name: "bad duration",
            args: with(&["--stop-timeout", "10x"], &[]),
            env: vec![],
            want: "--stop-timeout \"10x\"",
        },
        Case {
            name: "bad duration in env",
            args: with(&[], &[]),
            env: vec![("ETCD_WARDEN_STOP_TIMEOUT", "soon".into())],
            want: "--stop-timeout \"soon\"",
        },
        Case {
            name: "a cluster member without a shared store",
            args: with(
                &[],
                &[
                    "--initial-cluster",
                    "a=http://127.0.0.1:2380,b=http://127.0.0.2:2380",
                ],
            ),
            env: vec![],
            want: "every member of a cluster needs the same store",
        },
        Case {
            name: "an etcd word no release knows",
            args: with(&[], &["--unsafe-no-fsnyc", "--name", "x"]),
            env: vec![],
            want: "--unsafe-no-fsnyc is not a flag of etcd",
        },
        Case {
            name: "unknown store scheme",
            args: with(&["--store", "s4://x"], &[]),
            env: vec![],
            want: "unknown scheme \"s4\" (use file, s3, gs or az)",
        },
        Case {
            name: "store without bucket",
            args: with(&["--store", "s3:///p"], &[]),
            env: vec![],
            want: "missing the bucket name",
        },
        Case {
            name: "missing -- etcd",
            args: vec!["run".into(), "--listen".into(), listen.clone()],
            env: vec![],
            want: "missing the etcd command line",
        },
        Case {
            name: "etcd binary missing",
            args: vec![
                "run".into(),
                "--".into(),
                "/nonexistent/etcd".into(),
                "--data-dir".into(),
                data.display().to_string(),
            ],
            env: vec![],
            want: "etcd command \"/nonexistent/etcd\"",
        },
        Case {
            name: "etcd not in PATH",
            args: vec!["run".into(), "--".into(), "etcd-nope-nope".into()],
            env: vec![],
            want: "not found in PATH",
        },
        Case {
            name: "data dir is a file",
            args: vec![
                "run".into(),
                "--".into(),
                fake.display().to_string(),
                "--data-dir".into(),
                a_file.display().to_string(),
            ],
            env: vec![],
            want: "is not a directory",
        },
        Case {
            name: "unknown key in config file",
            args: with(&["--config", toml.to_str().unwrap()], &[]),
            env: vec![],
            want: "unknown field `stop-timout`",
        },
        Case {
            name: "bad listen address",
            args: {
                let mut v = with(&[], &[]);
                v[2] = "localhost".into();
                v
            },
            env: vec![],
            want: "--listen \"localhost\"",
        },
        Case {
            name: "listen address in use",
            args: {
                let mut v = with(&[], &[]);
                v[2] = format!("{busy_ip}:2378");
                v
            },
            env: vec![],
            want: "pick a free address",
        },
        Case {
            name: "etcd flag without value",
            args: with(&[], &["--name"]),
            env: vec![],
            want: "etcd flag --name needs a value",
        },
        Case {
            name: "bad etcd URL",
            args: with(&[], &["--listen-client-urls", "://x"]),
            env: vec![],
            want: "flag --listen-client-urls",
        },
        Case {
            name: "bad log format",
            args: with(&["--log-format", "xml"], &[]),
            env: vec![],
            want: "xml",
        },
        Case {
            name: "missing TLS file",
            args: with(
                &["--etcd-ca", "/nonexistent/ca.pem"],
                &["--listen-client-urls", "https://127.0.0.1:2379"],
            ),
            env: vec![],
            want: "TLS file \"/nonexistent/ca.pem\"",
        },
        Case {
            name: "bad full snapshot cron",
            args: with(&["--full-snapshot-schedule", "every hour"], &[]),
            env: vec![],
            want: "--full-snapshot-schedule",
        },
        Case {
            name: "bad defrag cron in env",
            args: with(&[], &[]),
            env: vec![("ETCD_WARDEN_DEFRAG_SCHEDULE", "61 * * * *".into())],
            want: "--defrag-schedule",
        },
        Case {
            name: "bad verify cron",
            args: with(&["--verify-schedule", "sometimes"], &[]),
            env: vec![],
            want: "--verify-schedule",
        },
        Case {
            name: "bad retention",
            args: with(&["--retention", "last:zero"], &[]),
            env: vec![],
            want: "--retention",
        },
        Case {
            name: "bad delta size",
            args: with(&["--delta-snapshot-max-bytes", "12 parsecs"], &[]),
            env: vec![],
            want: "--delta-snapshot-max-bytes",
        },
        Case {
            name: "bad compression",
            args: with(&["--compression", "lz4"], &[]),
            env: vec![],
            want: "lz4",
        },
        Case {
            name: "a warden option after --",
            args: with(&[], &["--delta-snapshot-period=5s"]),
            env: vec![],
            want: "--delta-snapshot-period after `--` goes to etcd, which has no such flag; it is an etcd-warden option: put it before `--`",
        },
        Case {
            name: "a missing required argument",
            args: vec![
                "restore".into(),
                "--store".into(),
                format!("file://{}", d.display()),
            ],
            env: vec![],
            want: "the following required arguments were not provided; --data-dir <DIR>",
        },
        Case {
            name: "a read command on a file store that does not exist",
            args: vec![
                "backups".into(),
                "list".into(),
                "--store".into(),
                format!("file://{}", data.display()),
            ],
            env: vec![],
            want: "is not a directory, so it holds no backups (check the path; nothing was created)",
        },
        Case {
            name: "bad age recipient",
            args: with(&["--encrypt-to", "age1notakey"], &[]),
            env: vec![],
            want: "etcd-warden: --encrypt-to: \"age1notakey\" is not an age X25519 recipient",
        },
        Case {
            name: "missing recipients file",
            args: with(&["--encrypt-to-file", "/nonexistent/recipients.txt"], &[]),
            env: vec![],
            want: "/nonexistent/recipients.txt",
        },
        Case {
            name: "identity file without a key",
            args: with(&["--identity-file", toml.to_str().unwrap()], &[]),
            env: vec![],
            want: "--identity-file",
        },
        Case {
            name: "etcd given without --",
            args: vec![
                "run".into(),
                "--listen".into(),
                listen.clone(),
                fake.display().to_string(),
                "--data-dir".into(),
                data.display().to_string(),
            ],
            env: vec![],
            want: "tip: etcd and its flags go after `--`, as in etcd-warden run [OPTIONS] -- ",
        },
        Case {
            name: "restore into a file",
            args: vec![
                "restore".into(),
                "--store".into(),
                format!("file://{}", d.display()),
                "--data-dir".into(),
                a_file.display().to_string(),
            ],
            env: vec![],
            want: "a-file\": is not a directory (restore into a new or empty directory",
        },
        Case {
            name: "a time without its offset",
            args: vec![
                "restore".into(),
                "--store".into(),
                format!("file://{}", d.display()),
                "--data-dir".into(),
                data.display().to_string(),
                "--etcd".into(),
                fake.display().to_string(),
                "--to-time".into(),
                "2026-11-29T16:30:00".into(),
            ],
            env: vec![],
            want: "(write RFC 3339 with its offset",
        },
        Case {
            name: "sign key that is no Ed25519 key",
            args: with(&["--sign-key", toml.to_str().unwrap()], &[]),
            env: vec![],
            want: "--sign-key",
        },
        Case {
            name: "verify key file missing, by variable",
            args: with(&[], &[]),
            env: vec![("ETCD_WARDEN_VERIFY_KEY", "/nonexistent/verify.pem".into())],
            want: "etcd-warden: --verify-key: /nonexistent/verify.pem",
        },
        Case {
            name: "admin token too short",
            args: with(&["--admin-token-file", short_token.to_str().unwrap()], &[]),
            env: vec![],
            want: "at least 16 characters",
        },
        Case {
            name: "admin token file missing",
            args: with(&["--admin-token-file", "/nonexistent/token"], &[]),
            env: vec![],
            want: "--admin-token-file: /nonexistent/token",
        },
        Case {
            name: "store credentials not KEY=VALUE",
            args: with(&["--store-credentials", bad_creds.to_str().unwrap()], &[]),
            env: vec![],
            want: "--store-credentials",
        },
        Case {
            name: "owner name without id",
            args: with(&["--owner-name", "_owner.example.com"], &[]),
            env: vec![],
            want: "--owner-id: missing",
        },
        Case {
            name: "owner id without name (env)",
            args: with(&[], &[]),
            env: vec![("ETCD_WARDEN_OWNER_ID", "host-a".into())],
            want: "--owner-name: missing",
        },
        Case {
            name: "owner check option without the check",
            args: with(&["--owner-check-interval", "5s"], &[]),
            env: vec![],
            want: "--owner-check-interval: needs --owner-name and --owner-id",
        },
        Case {
            name: "owner name not a DNS name",
            args: with(&["--owner-name", "no spaces.example", "--owner-id", "a"], &[]),
            env: vec![],
            want: "is not a DNS name",
        },
        Case {
            name: "owner resolver not IP:PORT",
            args: with(
                &[
                    "--owner-name",
                    "o.example",
                    "--owner-id",
                    "a",
                    "--owner-check-resolver",
                    "dns.example:53",
                ],
                &[],
            ),
            env: vec![],
            want: "--owner-check-resolver: \"dns.example:53\" is not IP:PORT",
        },
        Case {
            name: "owner timeout longer than the interval",
            args: with(
                &[
                    "--owner-name",
                    "o.example",
                    "--owner-id",
                    "a",
                    "--owner-check-interval",
                    "1s",
                    "--owner-check-timeout",
                    "2s",
                ],
                &[],
            ),
            env: vec![],
            want: "not longer than the interval",
        },
        Case {
            name: "owner interval not a duration",
            args: with(
                &[
                    "--owner-name",
                    "o.example",
                    "--owner-id",
                    "a",
                    "--owner-check-interval",
                    "often",
                ],
                &[],
            ),
            env: vec![],
            want: "--owner-check-interval \"often\"",
        },
    ];
    for case in cases {
        let mut cmd = Command::new(WARDEN);
        cmd.args(&case.args);
        for (k, v) in &case.env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(64),
            "{}: exit {:?}, stderr {stderr}",
            case.name,
            out.status
        );
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "{}: not one line: {stderr}",
            case.name
        );
        assert!(
            stderr.contains(case.want),
            "{}: {stderr:?} does not mention {:?}",
            case.name,
            case.want
        );
        assert!(!marker.exists(), "{}: etcd was started", case.name);
        assert!(!data.exists(), "{}: the data dir was created", case.name);
        assert_eq!(
            std::fs::read_to_string(&a_file).unwrap(),
            "not a dir",
            "{}",
            case.name
        );
        assert!(
            !Path::new(&format!("{}.backups", data.display())).exists(),
            "{}: store created",
            case.name
        );
    }
}

#[test]
fn help_and_version_exit_0_and_document_signals() {
    let out = Command::new(WARDEN).args(["run", "--help"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "SIGUSR1",
        "SIGTERM",
        "--stop-timeout",
        "ETCD_WARDEN_STORE",
        "--store",
    ] {
        assert!(help.contains(needle), "run --help lacks {needle}:\n{help}");
    }
    let out = Command::new(WARDEN).arg("--version").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
}

fn probe(url: &str) -> (i32, String) {
    let out = Command::new(WARDEN)
        .args(["probe", "--url", url])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn probe_exits_0_only_when_ready() {
    let etcd = etcd34();
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let mut argv = vec![etcd.display().to_string()];
    argv.extend(etcd_args(&ip, &dir.path().join("data")));
    let url = format!("http://{ip}:2378/readyz");

    assert_eq!(probe(&url).0, 1, "nothing listening must not be ready");
    assert_eq!(probe("ftp://x/readyz").0, 64, "a bad URL is bad usage");

    let w = Warden::start(&ip, &["--restart-backoff-min", "3s"], &argv);
    w.wait_ready(Duration::from_secs(30));
    let (code, err) = probe(&url);
    assert_eq!(code, 0, "{err}");

    // etcd dies: the probe fails while the warden waits out the backoff.
    let pid = w.etcd_pid().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    let err = wait_for(
        "the probe to fail after etcd died",
        Duration::from_secs(3),
        || {
            let (code, err) = probe(&url);
            (code == 1).then_some(err)
        },
    );
    assert!(err.contains("503"), "{err}");
}

/// A misspelled `ETCD_WARDEN_*` variable is named with the closest real one, on every command;
/// `run` refuses it (64) before etcd starts; real names raise no warning.
#[test]
fn a_misspelled_warden_variable_is_named_with_the_closest_real_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let out = Command::new(WARDEN)
        .args(["backups", "list", "--store", &store])
        .env("ETCD_WARDEN_STOER", "file:///elsewhere")
        .env("ETCD_WARDEN_LISTEN", "127.0.0.1:1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("ETCD_WARDEN_STOER is not one etcd-warden reads")
            && stderr.contains("did you mean ETCD_WARDEN_STORE?"),
        "no hint for the typo: {stderr}"
    );
    assert!(
        !stderr.contains("ETCD_WARDEN_LISTEN"),
        "a real name was warned about: {stderr}"
    );

    // `run` with a real etcd that would start: refused before anything starts or is created,
    // whatever the host has on PATH.
    let ip = unique_ip();
    let data = dir.path().join("data");
    let mut cmd = Command::new(WARDEN);
    cmd.args(["run", "--listen", &format!("{ip}:2378"), "--store", &store])
        .arg("--")
        .arg(default_etcd())
        .args(etcd_args(&ip, &data))
        .env("ETCD_WARDEN_STOP_TIMOUT", "5s")
        .current_dir(dir.path());
    dies_with_test(&mut cmd);
    let out = output_within(cmd, Duration::from_secs(20), "run with a misspelled variable");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("did you mean ETCD_WARDEN_STOP_TIMEOUT?"),
        "run's refusal lacks the hint: {stderr}"
    );
    assert!(!data.exists(), "a data dir was created: {stderr}");
}

/// The output of `cmd`, which must end within `limit`: a command that would ask an unreachable
/// metadata service hangs for minutes, so it is killed and the test names the wait.
fn output_within(mut cmd: Command, limit: Duration, what: &str) -> std::process::Output {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            panic!("{what} did not end within {limit:?}");
        }
    }
}

/// A cloud store with no credentials in the environment (or the credentials file) is refused at
/// once with exit 64, naming the variables to set and how to choose the instance metadata service,
/// by `run` (before etcd starts, nothing created) and by every command that reads a store. The
/// environment is emptied but for PATH and a HOME without a gcloud default file.
#[test]
fn a_cloud_store_without_credentials_is_refused_at_once_naming_the_variables() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let marker = d.join("etcd-was-started");
    let fake = d.join("fake-etcd");
    std::fs::write(
        &fake,
        format!("#!/bin/sh\ntouch {}\nexec sleep 600\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let home = d.join("home");
    std::fs::create_dir(&home).unwrap();
    let data = d.join("data");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "run".into(),
                "--listen".into(),
                format!("{}:2378", unique_ip()),
                "--store".into(),
                "s3://bucket/etcd".into(),
                "--".into(),
                fake.display().to_string(),
                "--data-dir".into(),
                data.display().to_string(),
            ],
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        ),
        (
            vec![
                "backups".into(),
                "list".into(),
                "--store".into(),
                "s3://bucket/etcd".into(),
            ],
            "AWS_METADATA_ENDPOINT=http://169.254.169.254",
        ),
        (
            vec![
                "backups".into(),
                "list".into(),
                "--store".into(),
                "gs://bucket/etcd".into(),
            ],
            "GOOGLE_APPLICATION_CREDENTIALS",
        ),
        (
            vec![
                "restore".into(),
                "--store".into(),
                "az://container/etcd".into(),
                "--data-dir".into(),
                data.display().to_string(),
            ],
            "AZURE_STORAGE_ACCOUNT_KEY",
        ),
    ];
    for (args, want) in cases {
        let mut cmd = Command::new(WARDEN);
        cmd.args(&args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap())
            .env("HOME", &home)
            .current_dir(d);
        let out = output_within(cmd, Duration::from_secs(10), &args.join(" "));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(
            stderr.contains("names no credentials") && stderr.contains(want),
            "{args:?}: {stderr:?} does not name {want:?}"
        );
        assert!(!marker.exists(), "{args:?}: etcd was started");
        assert!(!data.exists(), "{args:?}: the data dir was created");
    }
}

/// etcd-client's build script runs `scripts/protoc` (named by .cargo/config.toml): with no protoc
/// on PATH it runs the one cargo downloaded with the build-dependency; with neither, it says in
/// one line how to get one.
#[test]
fn the_build_finds_a_protoc_without_a_system_one() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = std::fs::read_to_string(root.join(".cargo/config.toml")).unwrap();
    assert!(
        config.contains(r#"PROTOC = { value = "scripts/protoc", relative = true"#),
        ".cargo/config.toml no longer points PROTOC at scripts/protoc:\n{config}"
    );
    // A PATH with the shell's tools the script uses and no protoc.
    let bin = tempfile::tempdir().unwrap();
    let uname = ["/usr/bin/uname", "/bin/uname"]
        .iter()
        .find(|p| Path::new(p).exists())
        .unwrap();
    std::os::unix::fs::symlink(uname, bin.path().join("uname")).unwrap();
    let run = |cargo_home: &std::ffi::OsStr| {
        Command::new("/bin/sh")
            .arg(root.join("scripts/protoc"))
            .arg("--version")
            .env_clear()
            .env("PATH", bin.path())
            .env("CARGO_HOME", cargo_home)
            .env("HOME", bin.path())
            .output()
            .unwrap()
    };
    let home = std::env::var_os("CARGO_HOME").unwrap_or_else(|| {
        Path::new(&std::env::var_os("HOME").unwrap())
            .join(".cargo")
            .into()
    });
    let out = run(&home);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.starts_with("libprotoc "),
        "the vendored protoc did not run: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let empty = tempfile::tempdir().unwrap();
    let out = run(empty.path().as_os_str());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("apt-get install protobuf-compiler"), "{stderr}");
}

/// A TLS file that cannot be read, named by etcd's flag, its `ETCD_*` variable, or the warden's
/// own `--etcd-cert` (even with plain http endpoints), is refused with 64 naming where it came
/// from, before etcd starts and before anything is created: etcd would exit at every start.
#[test]
fn a_missing_tls_file_is_refused_before_etcd_starts() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let missing = dir.path().join("pki/etcd/server.crt");
    let ip = unique_ip();
    let data = dir.path().join("data");
    let missing_s = missing.display().to_string();
    type Case<'a> = (Vec<String>, Vec<(&'a str, String)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec!["--cert-file".into(), missing_s.clone()],
            vec![],
            "flag --cert-file",
        ),
        (
            vec![],
            vec![("ETCD_PEER_KEY_FILE", missing_s.clone())],
            "variable ETCD_PEER_KEY_FILE",
        ),
        (
            vec![],
            vec![
                ("ETCD_WARDEN_ETCD_CERT", missing_s.clone()),
                ("ETCD_WARDEN_ETCD_KEY", missing_s.clone()),
            ],
            "--etcd-cert",
        ),
    ];
    for (flags, env, named) in cases {
        let mut cmd = Command::new(WARDEN);
        cmd.args(["run", "--listen", &format!("{ip}:2378"), "--store", &store])
            .arg("--")
            .arg(default_etcd())
            // Plain http underneath: each case adds the one TLS setting it is about.
            .args(etcd_args_http(&ip, &data))
            .args(&flags)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .current_dir(dir.path());
        dies_with_test(&mut cmd);
        let out = output_within(cmd, Duration::from_secs(20), named);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{named}: {stderr}");
        assert!(
            stderr.contains(named) && stderr.contains(&missing_s),
            "the refusal does not name {named} and the file: {stderr}"
        );
        assert!(
            !data.exists() && !dir.path().join("store").exists(),
            "{named}: something was created: {stderr}"
        );
    }
}

/// Every file under `dir`, sorted.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.path().is_dir() {
                todo.push(e.path());
            } else {
                out.push(e.path().display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// `cluster restore --to-revision` past what the store holds is refused (64) and writes no plan:
/// every member would otherwise restore less than the operator asked for, as the offline
/// `restore` refuses to call that the result.
#[test]
fn a_cluster_restore_beyond_the_newest_backup_writes_no_plan() {
    let ip = unique_ip();
    let dir = tempfile::tempdir().unwrap();
    let (w, store) = warden_with_file_store(&default_etcd(), &ip, dir.path(), &[]);
    drop(w);
    let before = files_under(&dir.path().join("store"));
    let out = Command::new(WARDEN)
        .args([
            "cluster",
            "restore",
            "--store",
            &store,
            "--to-revision",
            "1000000",
        ])
        .args(["--initial-cluster", &format!("m1=http://{ip}:2380")])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("--to-revision 1000000") && stderr.contains("reach revision"),
        "the refusal does not say what the store reaches: {stderr}"
    );
    assert_eq!(
        files_under(&dir.path().join("store")),
        before,
        "the store changed: {stderr}"
    );
}

/// One-shot commands that fail on what they talk to say which input and what fix, and create
/// nothing on the way: `snapshot` at an etcd that does not answer leaves no store directory behind;
/// an s3:// store behind a plain-http endpoint names AWS_ALLOW_HTTP.
#[test]
fn one_shot_failures_name_the_cause_and_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let nobody = unique_ip();
    let out = Command::new(WARDEN)
        .args(["snapshot", "--store", &format!("file://{}", store.display())])
        .args(["--endpoints", &format!("http://{nobody}:2379")])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "etcd at http://{nobody}:2379 does not answer (connection refused): check --endpoints"
        )),
        "{stderr}"
    );
    assert!(
        !store.exists(),
        "snapshot created the store although etcd did not answer"
    );

    let out = Command::new(WARDEN)
        .args(["backups", "list", "--store", "s3://bucket/prefix"])
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT", format!("http://{nobody}:9000"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("set AWS_ALLOW_HTTP=true for an s3:// store"),
        "{stderr}"
    );
}
