//! docs/reference.md is generated from the code: clap's own definitions of every command and
//! option (with its environment variable and default), the signal table of `--help`, and the
//! metrics as the golden scrape (tests/golden/metrics.txt) lists them. This test fails when the
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
        "# etcd-warden reference\n\nGenerated from the code by `scripts/reference` (tests/reference.rs fails when this file is stale); do not edit by hand.\n\n",
    );
    let _ = writeln!(
        out,
        "Version: `{}`\n",
        etcd_warden::config::VERSION.split(' ').next().unwrap()
    );
    out.push_str("Exit codes: 0 success; 1 failure; 2 `restore` ended below the newest backup (see `--accept-older`); 64 bad usage or configuration (nothing was started, changed or deleted); `run` exits with etcd's own status after a stop (143 = SIGTERM, a clean stop).\n\n");
    let _ = writeln!(out, "```\n{}\n```\n", etcd_warden::config::SIGNALS_HELP.trim());
    options(&etcd_warden::config::Cli::command(), "etcd-warden", &mut out);
    out.push_str("## Metrics\n\nAs served on `/metrics` (series that exist only in some set-ups, such as cluster roles, ownership or `--kube-encryption-config`, are in docs/metrics.md).\n\n| metric | type | meaning |\n|---|---|---|\n");
    let golden =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/metrics.txt")).unwrap();
    let mut types = std::collections::HashMap::new();
    for l in golden.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            if let Some((n, t)) = rest.split_once(' ') {
                types.insert(n.to_owned(), t.to_owned());
            }
        }
    }
    for l in golden.lines() {
        if let Some(rest) = l.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let _ = writeln!(
                out,
                "| `{name}` | {} | {} |",
                types.get(name).map(String::as_str).unwrap_or(""),
                help.replace('|', "\\|")
            );
        }
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
