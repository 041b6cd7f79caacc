//! `etcd-warden cluster restore`: a quorum-loss recovery plan written into the store, which every
//! member's warden applies (`crate::startup::plan`).

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::EX_USAGE;
use super::run::args::DEFAULT_RESTORE_BUMP;
use super::shared::{ReadKeys, bump_of, keys, open_store, rollback_point, target_of};

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Quorum lost: write a restore plan into the store. Every member's warden that finds it while
    /// its cluster has no quorum restores the same chain to the same revision with a new cluster
    /// token and starts a new cluster; all members come up with the same history.
    Restore(ClusterRestoreArgs),
}

#[derive(Debug, Args)]
pub struct ClusterRestoreArgs {
    /// The store the cluster's wardens back up to (their --store).
    #[arg(long, env = "ETCD_WARDEN_STORE", value_name = "URL")]
    pub store: String,
    /// Restore to this revision.
    #[arg(long, value_name = "N", conflicts_with = "to_time")]
    pub to_revision: Option<i64>,
    /// Restore to the newest delta written at or before this time (RFC 3339).
    #[arg(long, value_name = "RFC3339")]
    pub to_time: Option<String>,
    /// Raise the restored revision by N and mark every revision up to it compacted (etcdutl's
    /// --bump-revision N --mark-compacted), as the automatic restore of `run` does: clients that
    /// saw newer revisions are never handed those numbers again, and watchers from before are told
    /// to relist. 0 restores an exact copy.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_RESTORE_BUMP, value_parser = super::run::args::bump_range())]
    pub bump_revision: u64,
    /// Accepted for etcdutl's spelling: implied by a --bump-revision above 0.
    #[arg(long)]
    pub mark_compacted: bool,
    /// The members, name=peer-url,... [default: the member list the store recorded]
    #[arg(long, value_name = "NAME=URL,...")]
    pub initial_cluster: Option<String>,
    /// Members apply the plan at their next start even if their cluster still has quorum.
    #[arg(long)]
    pub force: bool,
    /// Replace the pending plan (one not yet applied by every member): members that applied it
    /// restore by the new one too. Without it, a second plan while one is pending is refused.
    #[arg(long)]
    pub replace: bool,
    #[command(flatten)]
    pub keys: ReadKeys,
    /// Sign the plan (and read the backups) with this Ed25519 private key, the one the members'
    /// wardens sign with (`run --sign-key`): members that verify refuse an unsigned plan.
    #[arg(long, env = "ETCD_WARDEN_SIGN_KEY", value_name = "FILE")]
    pub sign_key: Option<PathBuf>,
    /// Roll a cluster back after an etcd upgrade: every member restores the newest rollback point of
    /// data written by this etcd release (3.5, or 3.5.30 exactly); start the members with that
    /// release's binary. With --force when the members' data is sound
    #[arg(long, value_name = "VERSION", conflicts_with_all = ["to_revision", "to_time"])]
    pub etcd_version: Option<String>,
}

/// `cluster restore`: writes the plan every member's warden restores by.
pub async fn cluster_restore(args: ClusterRestoreArgs) -> i32 {
    let keys = match keys(None, None, &args.keys, args.sign_key.as_deref()) {
        Ok(k) => k,
        Err(code) => return code,
    };
    let store = match open_store(&args.store, keys) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let target = match &args.etcd_version {
        Some(v) => match rollback_point(&store, v).await {
            Ok(point) => crate::restore::Target::Rollback(point),
            Err(code) => return code,
        },
        None => match target_of(args.to_revision, args.to_time.as_deref()) {
            Ok(t) => t,
            Err(code) => return code,
        },
    };
    if let Err(e) = bump_of(args.bump_revision, args.mark_compacted) {
        eprintln!("etcd-warden: {e}; nothing was written");
        return EX_USAGE;
    }
    let req = crate::cluster::restore::PlanRequest {
        target,
        bump_revision: args.bump_revision,
        initial_cluster: args.initial_cluster.clone(),
        force: args.force,
        replace: args.replace,
    };
    match crate::cluster::restore::write_plan(&store, &req).await {
        Ok(plan) => {
            if let Some(old) = &plan.replaces {
                println!(
                    "cluster restore plan {old} is replaced: members that restored by it restore by this one too"
                );
            }
            println!(
                "cluster restore plan {} written to {}: every member restores {} to revision {}{}, as a new cluster (token {}):",
                plan.id,
                args.store,
                plan.full,
                plan.target_revision,
                if plan.bump_revision > 0 {
                    format!(" (bumped by {}, compacted)", plan.bump_revision)
                } else {
                    String::new()
                },
                plan.token
            );
            for m in &plan.members {
                println!("  {} {}", m.name, m.peer_urls.join(","));
            }
            println!(
                "each member's warden applies it once it finds no quorum{}; /status of each shows it",
                if plan.force {
                    " (or at its next start: --force)"
                } else {
                    ""
                }
            );
            0
        }
        Err(
            crate::cluster::restore::PlanError::Pending(why)
            | crate::cluster::restore::PlanError::Beyond(why),
        ) => {
            eprintln!("etcd-warden: cluster restore: {why}; nothing was written");
            EX_USAGE
        }
        Err(crate::cluster::restore::PlanError::Other(e)) => {
            eprintln!("etcd-warden: cluster restore: {e}; nothing was written");
            1
        }
    }
}

/// Runs a `cluster` command.
pub fn main(cmd: ClusterCommand) -> i32 {
    match cmd {
        ClusterCommand::Restore(args) => super::one_shot_quiet(cluster_restore(args)),
    }
}
