//! `etcd-warden standby`: `run`'s options plus how often to look at the store; the warden follows
//! the store with no etcd running until promoted (`crate::standby`), then runs as `run` does.

use std::time::Duration;

use clap::Args;

use super::parse_duration_arg;
use super::run::args::RunArgs;

#[derive(Debug, Clone, Args)]
pub struct StandbyArgs {
    /// How often the store is listed for new deltas.
    #[arg(long, env = "ETCD_WARDEN_STANDBY_POLL", value_name = "DURATION", default_value = "1s", value_parser = parse_duration_arg)]
    pub standby_poll: Duration,
    /// Promotion refuses while the store's newest object is younger than this (the primary still
    /// writes); `ctl promote --force` skips the check.
    #[arg(long, env = "ETCD_WARDEN_STANDBY_QUIET", value_name = "DURATION", default_value = "30s", value_parser = parse_duration_arg)]
    pub standby_quiet: Duration,
    #[command(flatten)]
    pub run: RunArgs,
}

/// Runs `standby`.
pub fn main(args: StandbyArgs, env_warnings: &[String]) -> i32 {
    let standby = crate::standby::StandbyConfig {
        poll: args.standby_poll,
        quiet: args.standby_quiet,
    };
    super::run::main(args.run, Some(standby), env_warnings)
}
