//! docs/reference.md is generated from the code: clap's own definitions of every command and
//! option (with its environment variable and default), the signal table of `--help`, the HTTP
//! endpoints (`http::ENDPOINTS`, the table `route` serves from) and every metric
//! (`metrics::METRICS`, the table the exposition takes help and type from). This test fails when the
//! committed file differs from what the code generates; `scripts/reference` rewrites it.
#![allow(clippy::disallowed_methods)]

use std::fmt::Write;

use clap::CommandFactory;

fn options(cmd: &clap::Command, path: &str, out: &mut String) {
    if cmd.is_hide_set() {
        return;
    }
    let args: Vec<&clap::Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && a.get_id() != "help" && a.get_id() != "version")
        .collect();
    let subs: Vec<&clap::Command> = cmd.get_subcommands().filter(|s| !s.is_hide_set()).collect();
    let _ = writeln!(out, "## `{path}`\n");
    if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
        let _ = writeln!(out, "{about}\n");
    }
    if !args.is_empty() {
        let _ = writeln!(
            out,
            "| option | environment | default | meaning |\n|---|---|---|---|"
        );
        for a in args {
            let name = match (a.get_long(), a.get_value_names()) {
                (Some(l), Some(v)) if a.get_action().takes_values() => format!("--{l} {}", v.join(" ")),
                (Some(l), _) => format!("--{l}"),
                (None, Some(v)) => v.join(" "),
                (None, None) => a.get_id().to_string(),
            };
            let aliases = a
                .get_all_aliases()
                .map(|al| format!(" (alias --{})", al.join(", --")))
                .unwrap_or_default();
            let env = a
                .get_env()
                .map(|e| format!("`{}`", e.to_string_lossy()))
                .unwrap_or_default();
            let default = a
                .get_default_values()
                .iter()
                .map(|d| d.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(",");
            let help = a
                .get_long_help()
                .or(a.get_help())
                .map(|h| h.to_string().replace('\n', " ").replace('|', "\\|"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "| `{name}`{aliases} | {env} | {} | {help} |",
                if default.is_empty() {
                    String::new()
                } else {
                    format!("`{default}`")
                }
            );
        }
        out.push('\n');
    }
    for s in subs {
        options(s, &format!("{path} {}", s.get_name()), out);
    }
}

fn generate() -> String {
    let mut out = String::from(
        "# etcd-warden reference\n\nGenerated from the code by `scripts/reference` (tests/reference.rs fails when this file is stale); do not edit by hand. The same definitions make the man pages in `docs/man` (`man -l docs/man/etcd-warden-run.1`).\n\n",
    );
    let _ = writeln!(
        out,
        "Version: `{}`\n",
        etcd_warden::cmd::VERSION.split(' ').next().unwrap()
    );
    out.push_str("Exit codes: 0 success; 1 failure; 2 `restore` ended below the newest backup (see `--accept-older`); 3 `undo` left keys alone that were changed meanwhile; 64 bad usage or configuration (nothing was started, changed or deleted); `run` exits with etcd's own status after a stop (143 = SIGTERM, a clean stop).\n\n");
    let _ = writeln!(out, "```\n{}\n```\n", etcd_warden::cmd::SIGNALS_HELP.trim());
    options(&etcd_warden::cmd::Cli::command(), "etcd-warden", &mut out);
    out.push_str("## HTTP endpoints\n\n`--listen` (default 0.0.0.0:2378) and the admin socket (`--admin-socket`, mode 0600) serve:\n\n| method | path | served on | answer |\n|---|---|---|---|\n");
    for e in etcd_warden::serve::http::ENDPOINTS {
        let _ = writeln!(
            out,
            "| {} | `{}` | {} | {} |",
            e.method,
            e.path,
            e.served,
            e.answer.replace('|', "\\|")
        );
    }
    out.push_str("\n## Metrics\n\nServed on `/metrics` (a counter's samples end in `_total`); *present* says when a series exists.\n\n| metric | type | present | meaning |\n|---|---|---|---|\n");
    for m in etcd_warden::serve::metrics::METRICS {
        // A counter's samples carry the `_total` suffix (what a query names).
        let (kind, suffix) = match m.kind {
            etcd_warden::serve::metrics::MetricKind::Counter => ("counter", "_total"),
            etcd_warden::serve::metrics::MetricKind::Gauge => ("gauge", ""),
        };
        let _ = writeln!(
            out,
            "| `{}{suffix}` | {kind} | {} | {} |",
            m.name,
            m.present,
            m.help.replace('|', "\\|")
        );
    }
    out
}

#[test]
fn the_committed_reference_is_what_the_code_generates() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/reference.md");
    let want = generate();
    if std::env::var_os("ETCD_WARDEN_WRITE_REFERENCE").is_some() {
        std::fs::write(path, &want).unwrap();
    }
    let have = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        have == want,
        "docs/reference.md is stale: run scripts/reference and commit the result"
    );
}

/// The man pages (docs/man/etcd-warden.1 and one per subcommand) are clap_mangen's rendering of the
/// same definitions; `scripts/reference` rewrites them too.
#[test]
fn the_committed_man_pages_are_what_the_code_generates() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/man");
    let fresh = tempfile::tempdir().unwrap();
    // The release without the commit the build stamps, which changes with every commit.
    fn without_commit(cmd: clap::Command) -> clap::Command {
        let release = etcd_warden::cmd::VERSION.split(' ').next().unwrap();
        cmd.version(release).mut_subcommands(without_commit)
    }
    clap_mangen::generate_to(without_commit(etcd_warden::cmd::Cli::command()), fresh.path()).unwrap();
    let pages = |d: &std::path::Path| -> std::collections::BTreeMap<String, Vec<u8>> {
        std::fs::read_dir(d)
            .map(|rd| {
                rd.flatten()
                    .map(|e| {
                        (
                            e.file_name().to_string_lossy().into_owned(),
                            std::fs::read(e.path()).unwrap(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let want = pages(fresh.path());
    assert!(
        want.contains_key("etcd-warden.1") && want.contains_key("etcd-warden-run.1"),
        "{:?}",
        want.keys()
    );
    if std::env::var_os("ETCD_WARDEN_WRITE_REFERENCE").is_some() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, body) in &want {
            std::fs::write(dir.join(name), body).unwrap();
        }
    }
    let have = pages(&dir);
    let stale: Vec<&String> = want
        .keys()
        .chain(have.keys())
        .filter(|k| want.get(*k) != have.get(*k))
        .collect();
    assert!(
        stale.is_empty(),
        "docs/man is stale ({stale:?}): run scripts/reference and commit the result"
    );
}
