//! Thin entry point: parse, validate, start logging, run, map the outcome to an exit code.

use std::collections::HashMap;
use std::process::exit;
use std::time::Duration;

use clap::Parser;
use etcd_warden::config::{Cli, Command, ProbeArgs, RestoreArgs, RunArgs, RunConfig};
use etcd_warden::process::{pid1, signals};
use etcd_warden::serve::http;
use etcd_warden::{cli, probe, run, telemetry};

/// Bad usage or configuration (sysexits EX_USAGE).
const EX_USAGE: i32 = 64;

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
    let env_warnings = etcd_warden::envvars::unknown(env_names.iter().map(String::as_str));
    if !matches!(cli.command, Command::Run(_) | Command::Standby(_)) {
        for w in &env_warnings {
            eprintln!("etcd-warden: warning: {w} (ignored)");
        }
    }
    let code = match cli.command {
        Command::Run(args) => run_command(*args, None, &env_warnings),
        Command::Standby(args) => {
            let standby = etcd_warden::standby::StandbyConfig {
                poll: args.standby_poll,
                quiet: args.standby_quiet,
            };
            run_command(args.run, Some(standby), &env_warnings)
        }
        Command::Probe(args) => probe_command(args),
        Command::Snapshot(args) => one_shot(cli::snapshot(args)),
        Command::Backups(etcd_warden::config::BackupsCommand::Verify {
            store,
            deep: true,
            etcd,
            keys,
            kube_encryption_config,
            ..
        }) => with_reaper(|reaper, _signals| {
            cli::verify_deep(store, etcd, keys, kube_encryption_config, reaper)
        }),
        Command::Backups(cmd) => one_shot(cli::backups(cmd)),
        Command::Restore(args) => restore_command(args),
        Command::Ctl(args) => one_shot_quiet(etcd_warden::ctl::ctl(args)),
        Command::Cluster(etcd_warden::config::ClusterCommand::Restore(args)) => {
            one_shot_quiet(cli::cluster_restore(args))
        }
        Command::Downgrade(args) => one_shot_quiet(cli::downgrade(args)),
        Command::Diff(args) => one_shot_quiet(etcd_warden::undo::command::diff(args)),
        Command::Undo(args) => one_shot_quiet(etcd_warden::undo::command::undo(args)),
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

fn run_command(
    args: RunArgs,
    standby: Option<etcd_warden::standby::StandbyConfig>,
    env_warnings: &[String],
) -> i32 {
    // A misspelled variable meant for the warden (its store, its stop timeout) would otherwise
    // leave that setting at its default while etcd runs: refused before anything starts.
    if !env_warnings.is_empty() {
        for w in env_warnings {
            eprintln!("etcd-warden: {w}");
        }
        eprintln!(
            "etcd-warden: refusing to start with an ETCD_WARDEN_* variable it does not read: rename or unset it"
        );
        return EX_USAGE;
    }
    let env: HashMap<String, String> = std::env::vars().collect();
    let config = match RunConfig::from_args(args, &env) {
        Ok(c) => RunConfig { standby, ..c },
        Err(err) => {
            eprintln!("etcd-warden: {err}");
            return EX_USAGE;
        }
    };
    let checked = match config.standby {
        Some(_) => etcd_warden::standby::check_usage(&config.member),
        None => etcd_warden::standby::check_not_a_standby(&config.member),
    };
    if let Err(e) = checked {
        eprintln!("etcd-warden: {e}");
        return EX_USAGE;
    }
    telemetry::init_logging(config.log_format);

    let reaper = pid1::Reaper::new();
    let role = match pid1::become_reaper() {
        Ok(role) => role,
        Err(err) => {
            tracing::error!(error = %err, "failed to become the child subreaper");
            return 1;
        }
    };
    let signals = match signals::start(reaper.clone()) {
        Ok(rx) => rx,
        Err(err) => {
            tracing::error!(error = %err, "failed to install signal handlers");
            return 1;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("warden")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            tracing::error!(error = %err, "failed to start the async runtime");
            return 1;
        }
    };
    let code = runtime.block_on(async {
        let listener = match http::bind(config.listen).await {
            Ok(l) => l,
            Err(err) => {
                eprintln!(
                    "etcd-warden: --listen {}: {err} (pick a free address with --listen)",
                    config.listen
                );
                return EX_USAGE;
            }
        };
        let admin = match &config.admin_socket {
            Some(path) => match http::bind_admin(path) {
                Ok(l) => Some((l, path.clone())),
                Err(err) => {
                    eprintln!("etcd-warden: --admin-socket {}: {err}", path.display());
                    return EX_USAGE;
                }
            },
            None => None,
        };
        run::run(config, reaper, role, signals, listener, admin)
            .await
            .exit_code()
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    code
}

/// Runs a one-shot command on a small runtime, with warnings on stderr.
fn one_shot(fut: impl std::future::Future<Output = i32>) -> i32 {
    telemetry::init_logging(telemetry::LogFormat::Text);
    one_shot_quiet(fut)
}

/// `restore` spawns etcdutl and a private etcd, so it needs the reaper and its signal thread.
fn restore_command(args: RestoreArgs) -> i32 {
    with_reaper(|reaper, signals| cli::restore(args, reaper, signals))
}

/// Runs a one-shot command that spawns helpers: reaper, subreaper bit and signal thread first.
fn with_reaper<F, Fut>(f: F) -> i32
where
    F: FnOnce(pid1::Reaper, tokio::sync::mpsc::UnboundedReceiver<signals::SignalEvent>) -> Fut,
    Fut: std::future::Future<Output = i32>,
{
    telemetry::init_logging(telemetry::LogFormat::Text);
    let reaper = pid1::Reaper::new();
    if let Err(err) = pid1::become_reaper() {
        eprintln!("etcd-warden: become the child subreaper: {err}");
        return 1;
    }
    let signals = match signals::start(reaper.clone()) {
        Ok(rx) => rx,
        Err(err) => {
            eprintln!("etcd-warden: install signal handlers: {err}");
            return 1;
        }
    };
    one_shot_quiet(f(reaper, signals))
}

fn one_shot_quiet(fut: impl std::future::Future<Output = i32>) -> i32 {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => {
            let code = rt.block_on(fut);
            rt.shutdown_timeout(Duration::from_secs(1));
            code
        }
        Err(err) => {
            eprintln!("etcd-warden: start runtime: {err}");
            1
        }
    }
}

fn probe_command(args: ProbeArgs) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("etcd-warden: start runtime: {err}");
            return 1;
        }
    };
    match runtime.block_on(probe::probe(&args.url, args.timeout)) {
        Ok(body) => {
            println!("{body}");
            0
        }
        Err(err) => {
            eprintln!("etcd-warden: {err}");
            err.exit_code()
        }
    }
}
