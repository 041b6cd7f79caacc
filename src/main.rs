//! Thin entry point: parse, then hand each command to its `main` in `etcd_warden::cmd`, and exit
//! with the code it returns.

use std::process::exit;

use clap::Parser;
use etcd_warden::cmd::{self, Cli, Command, EX_USAGE};

fn main() {
    // Everything the warden writes is its own user's alone: store objects and directories of a
    // file store, restored data, decrypted scratch files, work dirs (0600 files, 0700 dirs).
    // etcd and the tools it starts inherit it; etcd makes its own files private anyway.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => exit(clap_error(err)),
    };
    let env_names: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .collect();
    let env_warnings = cmd::envvars::unknown(env_names.iter().map(String::as_str));
    if !matches!(cli.command, Command::Run(_) | Command::Standby(_)) {
        for w in &env_warnings {
            eprintln!("etcd-warden: warning: {w} (ignored)");
        }
    }
    let code = match cli.command {
        Command::Run(args) => cmd::run::main(*args, None, &env_warnings),
        Command::Standby(args) => cmd::standby::main(*args, &env_warnings),
        Command::Probe(args) => cmd::probe::main(args),
        Command::Snapshot(args) => cmd::snapshot::main(args),
        Command::Backups(command) => cmd::backups::main(command),
        Command::Restore(args) => cmd::restore::main(args),
        Command::Ctl(args) => cmd::ctl::main(args),
        Command::Cluster(command) => cmd::cluster::main(command),
        Command::Downgrade(args) => cmd::downgrade::main(args),
        Command::Diff(args) => cmd::undo::main_diff(args),
        Command::Undo(args) => cmd::undo::main_undo(args),
    };
    exit(code);
}

/// Clap's error, squeezed to one line that keeps the tip (`--help` and `--version` exit 0).
fn clap_error(err: clap::Error) -> i32 {
    use clap::error::ErrorKind;
    if matches!(
        err.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = err.print();
        return if err.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
            EX_USAGE
        } else {
            0
        };
    }
    let rendered = err.render().to_string();
    // The error line, the lines indented under it (the missing arguments), and the tips.
    let mut parts: Vec<&str> = Vec::new();
    let mut under_error = false;
    for line in rendered.lines() {
        let t = line.trim();
        if let Some(e) = t.strip_prefix("error:") {
            parts.push(e.trim().trim_end_matches(':'));
            under_error = true;
        } else if under_error && line.starts_with(char::is_whitespace) && !t.is_empty() {
            parts.push(t);
        } else {
            under_error = false;
            if t.starts_with("tip:") {
                parts.push(t);
            }
        }
    }
    if parts.is_empty() {
        parts.push(rendered.trim());
    }
    // `etcd-warden run etcd --name m1`: the program was meant, and it goes after `--`.
    let program_tip;
    let command = std::env::args().nth(1).unwrap_or_default();
    if err.kind() == ErrorKind::UnknownArgument
        && matches!(command.as_str(), "run" | "standby")
        && let Some(clap::error::ContextValue::String(arg)) = err.get(clap::error::ContextKind::InvalidArg)
        && !arg.starts_with('-')
    {
        program_tip = format!(
            "tip: etcd and its flags go after `--`, as in etcd-warden {command} [OPTIONS] -- {arg} ..."
        );
        parts.push(&program_tip);
    }
    eprintln!("etcd-warden: {} (see etcd-warden --help)", parts.join("; "));
    EX_USAGE
}
