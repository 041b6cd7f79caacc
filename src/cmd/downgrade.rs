//! `etcd-warden downgrade VERSION`: etcd's own downgrade to the previous minor release, validated,
//! enabled and waited for; then what to restart the members with.

use std::time::Duration;

use clap::Args;

use super::shared::{EtcdClientArgs, connect, connect_to};
use super::{EX_USAGE, parse_duration_arg};

#[derive(Debug, Args)]
pub struct DowngradeArgs {
    /// The release to go back to: the previous minor, e.g. 3.6 from 3.7.
    #[arg(value_name = "VERSION")]
    pub target: String,
    #[command(flatten)]
    pub client: EtcdClientArgs,
    /// Give up waiting for the storage versions after this long.
    #[arg(long, default_value = "5m", value_parser = parse_duration_arg)]
    pub timeout: Duration,
}

/// `etcd-warden downgrade VERSION`: etcd's own downgrade, validated, enabled and waited for.
pub async fn downgrade(args: DowngradeArgs) -> i32 {
    use etcd_client::DowngradeOptions;
    // "3.6" or "3.6.0": a minor release.
    let Some(target) =
        crate::etcd::version::Version::parse(&format!("{}.0", args.target.trim_end_matches(".0")))
    else {
        eprintln!(
            "etcd-warden: downgrade {:?}: not a minor release (write e.g. 3.6)",
            args.target
        );
        return EX_USAGE;
    };
    let (endpoints, client) = match connect(&args.client).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    // One client per member: a status answer is that member's own.
    let mut members = Vec::new();
    for e in &endpoints {
        match connect_to(&args.client, e).await {
            Ok((_, c)) => members.push((e.clone(), c)),
            Err(code) => return code,
        }
    }
    // Every member's release now.
    let mut running = Vec::new();
    for (e, c) in members.iter_mut() {
        match c.status().await {
            Ok(s) => running.push((e.clone(), s.version().to_owned())),
            Err(err) => {
                eprintln!(
                    "etcd-warden: status of {e}: {err} (every member must answer; nothing was changed)"
                );
                return 1;
            }
        }
    }
    let now = running
        .iter()
        .filter_map(|(_, v)| crate::etcd::version::Version::parse(v))
        .min()
        .unwrap_or(target);
    if now.minor != target.minor + 1 || now.major != target.major {
        eprintln!(
            "etcd-warden: downgrade {}: the members run {} and etcd goes back one minor release at a time (to {}.{}); nothing was changed",
            args.target,
            running
                .iter()
                .map(|(e, v)| format!("{e} {v}"))
                .collect::<Vec<_>>()
                .join(", "),
            now.major,
            now.minor.saturating_sub(1)
        );
        return EX_USAGE;
    }
    if now.minor < 6 {
        eprintln!(
            "etcd-warden: etcd {now} has no complete downgrade; the way back to {}.{} is a rollback restore (`restore --etcd-version {}.{}`, or `cluster restore --etcd-version {}.{} --force`); nothing was changed",
            target.major, target.minor, target.major, target.minor, target.major, target.minor
        );
        return EX_USAGE;
    }
    let v = format!("{}.{}", target.major, target.minor);
    for (what, options) in [
        ("validate", DowngradeOptions::Validate(v.clone())),
        ("enable", DowngradeOptions::Enable(v.clone())),
    ] {
        if let Err(e) = client.maintenance_client().downgrade(options).await {
            eprintln!("etcd-warden: etcd refused downgrade {what} {v}: {e}");
            return 1;
        }
        println!("downgrade {what} {v}: accepted");
    }
    let want = format!("{v}.0");
    let deadline = std::time::Instant::now() + args.timeout;
    loop {
        let mut behind = Vec::new();
        for (e, c) in members.iter_mut() {
            match c.status().await {
                Ok(s) if s.storage_version() == want => {}
                Ok(s) => behind.push(format!("{e} at {}", s.storage_version())),
                Err(err) => behind.push(format!("{e}: {err}")),
            }
        }
        if behind.is_empty() {
            break;
        }
        if std::time::Instant::now() > deadline {
            eprintln!(
                "etcd-warden: the storage version is not {want} on every member after {:?}: {} (etcdctl downgrade cancel undoes the downgrade)",
                args.timeout,
                behind.join(", ")
            );
            return 1;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "every member's storage version is {want}: restart each member's warden with etcd {v}, one at a time, each ready before the next (the warden lets {v} start on this data). Before the first restart, `etcdctl downgrade cancel` undoes it."
    );
    0
}

/// Runs `downgrade`.
pub fn main(args: DowngradeArgs) -> i32 {
    super::one_shot_quiet(downgrade(args))
}
