//! `etcd-warden diff` and `etcd-warden undo`: the arguments checked, the two states read, the
//! changes printed (a table, or JSON for tools) and, for `undo`, written back.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::json;

use clap::Args;

use super::EX_USAGE;
use super::shared::EtcdClientArgs;
use super::shared::ReadKeys;
use crate::restore::Target;
use crate::store::Store;
use crate::undo::{Action, Change, Filter, State, apply, live, past};

/// `undo` left keys alone that someone changed meanwhile.
pub const EX_CONFLICTS: i32 = 3;

/// The store, the target and the key filter of `args`; exit 64 (said) for bad input.
fn point(args: &PointArgs, keep_values: bool) -> Result<(Store, Target, Filter, PathBuf), i32> {
    let keys = super::shared::keys(None, None, &args.keys, None)?;
    let store = super::shared::open_store(&args.store, keys)?;
    let target = super::shared::target_of(args.to_revision, args.to_time.as_deref())?;
    let scratch = args.scratch_dir.clone().unwrap_or_else(std::env::temp_dir);
    if !scratch.is_dir() {
        eprintln!(
            "etcd-warden: --scratch-dir {}: not a directory (name one with room for a full snapshot)",
            scratch.display()
        );
        return Err(EX_USAGE);
    }
    let filter = Filter {
        prefix: args.prefix.as_bytes().to_vec(),
        keep_values,
    };
    Ok((store, target, filter, scratch))
}

async fn client(live: &EtcdClientArgs) -> Result<(Vec<String>, etcd_client::Client), i32> {
    super::shared::connect(live).await
}

/// The past point, said on stderr with where it came from.
async fn read_past(
    store: &Store,
    target: Target,
    filter: &Filter,
    scratch: &std::path::Path,
) -> Result<past::Point, i32> {
    match past::state_at(store, target, filter, scratch).await {
        Ok(p) => {
            if let Some(note) = &p.note {
                eprintln!("etcd-warden: note: {note}");
            }
            Ok(p)
        }
        Err(e) => {
            eprintln!("etcd-warden: {e}");
            Err(1)
        }
    }
}

pub async fn diff(args: DiffArgs) -> i32 {
    let (store, target, filter, scratch) = match point(&args.point, false) {
        Ok(p) => p,
        Err(code) => return code,
    };
    // The live cluster first: a wrong endpoint is told before a long download.
    let mut live_client = None;
    if !args.against_latest {
        match client(&args.live).await {
            Ok(c) => live_client = Some(c),
            Err(code) => return code,
        }
    }
    let past = match read_past(&store, target, &filter, &scratch).await {
        Ok(p) => p,
        Err(code) => return code,
    };
    let (now, against, now_rev) = match live_client {
        Some((endpoints, mut c)) => match live::state_now(&mut c, &filter).await {
            Ok((s, rev)) => (s, endpoints.join(","), rev),
            Err(e) => {
                eprintln!("etcd-warden: {e}");
                return 1;
            }
        },
        None => match read_past(&store, Target::Latest, &filter, &scratch).await {
            Ok(p) => (p.state, "the newest backup".to_owned(), p.revision),
            Err(code) => return code,
        },
    };
    let changes = crate::undo::diff(&past.state, &now);
    print(&args.point, &past, &against, now_rev, &changes);
    0
}

pub async fn undo(args: UndoArgs) -> i32 {
    if args.point.prefix.is_empty() && !args.all {
        eprintln!(
            "etcd-warden: undo without --prefix would put every key of the cluster back: name the keys with --prefix \
             (e.g. --prefix /registry/secrets/shop/), or say --all; nothing was changed"
        );
        return EX_USAGE;
    }
    let (store, target, filter, scratch) = match point(&args.point, true) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let (endpoints, mut c) = match client(&args.live).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let past = match read_past(&store, target, &filter, &scratch).await {
        Ok(p) => p,
        Err(code) => return code,
    };
    let (now, now_rev): (State, i64) = match live::state_now(&mut c, &filter).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("etcd-warden: {e}");
            return 1;
        }
    };
    let changes = crate::undo::diff(&past.state, &now);
    if args.dry_run {
        print(&args.point, &past, &endpoints.join(","), now_rev, &changes);
        return 0;
    }
    eprintln!(
        "etcd-warden: writing back {} keys under {:?} as they were at revision {}",
        changes.len(),
        args.point.prefix,
        past.revision
    );
    crate::failpoint::pause("undo-before-write").await;
    let started = std::time::Instant::now();
    let outcome = match apply::undo(&mut c, &changes, args.force).await {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "etcd-warden: {e} (the keys before it were written back; run the same undo again to finish: it writes only what still differs)"
            );
            return 1;
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    if args.point.json {
        let v = json!({
            "prefix": args.point.prefix,
            "point": {"revision": past.revision, "full": past.full, "deltas": past.deltas},
            "revision_before": now_rev,
            "seconds": seconds,
            "outcome": outcome,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!(
            "undo of {:?} to revision {}: {} restored, {} deleted, {} re-created{} in {seconds:.1} s; etcd at revision {} (was {now_rev})",
            args.point.prefix,
            past.revision,
            outcome.restored,
            outcome.deleted,
            outcome.recreated,
            if outcome.forced > 0 {
                format!(
                    " ({} overwriting changes made meanwhile, --force)",
                    outcome.forced
                )
            } else {
                String::new()
            },
            outcome.revision.max(now_rev),
        );
        for (key, lease) in &outcome.leases_gone {
            println!("  lease {lease:x} of {key} no longer exists: written without a lease");
        }
        for c in &outcome.conflicts {
            println!(
                "  conflict: {} changed meanwhile (mod_revision {} when read, {} now): left alone; --force writes it anyway",
                c.key,
                c.expected_mod_revision,
                match c.found_mod_revision {
                    0 => "deleted".to_owned(),
                    r => r.to_string(),
                }
            );
        }
    }
    if outcome.conflicts.is_empty() {
        0
    } else {
        EX_CONFLICTS
    }
}

fn entry_json(e: &Option<crate::undo::Entry>) -> serde_json::Value {
    match e {
        Some(e) => json!({
            "create_revision": e.create_revision,
            "mod_revision": e.mod_revision,
            "size": e.size,
            "lease": e.lease,
        }),
        None => serde_json::Value::Null,
    }
}

/// The changes: JSON, or a line per key and the counts per group.
fn print(args: &PointArgs, past: &past::Point, against: &str, now_rev: i64, changes: &[Change]) {
    let counts = crate::undo::counts(args.prefix.as_bytes(), changes);
    let total = |a: Action| changes.iter().filter(|c| c.action == a).count();
    if args.json {
        let v = json!({
            "prefix": args.prefix,
            "point": {"revision": past.revision, "full": past.full, "deltas": past.deltas, "note": past.note},
            "against": {"source": against, "revision": now_rev},
            "changes": changes.iter().map(|c| json!({
                "action": c.action,
                "key": String::from_utf8_lossy(&c.key),
                "past": entry_json(&c.past),
                "now": entry_json(&c.now),
                "object": c.object(),
            })).collect::<Vec<_>>(),
            "counts": {
                "restore": total(Action::Restore),
                "delete": total(Action::Delete),
                "re-create": total(Action::Recreate),
            },
            "by_prefix": counts.iter().map(|(g, m)| (g.clone(), m.iter().map(|(a, n)| (a.word(), *n)).collect::<BTreeMap<_, _>>())).collect::<BTreeMap<_, _>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return;
    }
    println!(
        "returning {:?} to revision {} ({} + {} deltas) against {against} at revision {now_rev}:",
        args.prefix, past.revision, past.full, past.deltas
    );
    for c in changes {
        let what = match (&c.past, &c.now) {
            (Some(p), Some(n)) => format!(
                "mod_revision {} -> {} now, {} B -> {} B now",
                p.mod_revision, n.mod_revision, p.size, n.size
            ),
            (None, Some(n)) => format!("created at revision {}, {} B", n.create_revision, n.size),
            (Some(p), None) => format!("deleted since; was mod_revision {}, {} B", p.mod_revision, p.size),
            (None, None) => String::new(),
        };
        let object = c.object().map(|o| format!("  [{o}]")).unwrap_or_default();
        println!(
            "  {:<9} {}  ({what}){object}",
            c.action.word(),
            String::from_utf8_lossy(&c.key)
        );
    }
    println!(
        "{} keys: {} to restore, {} to delete, {} to re-create",
        changes.len(),
        total(Action::Restore),
        total(Action::Delete),
        total(Action::Recreate)
    );
    for (group, m) in &counts {
        let parts: Vec<String> = m.iter().map(|(a, n)| format!("{n} {}", a.word())).collect();
        println!("  {group}: {}", parts.join(", "));
    }
}

#[derive(Debug, Args)]
pub struct PointArgs {
    /// The store the warden backs up to (its --store); etcd-backup-restore's stores work too.
    #[arg(long, env = "ETCD_WARDEN_STORE", value_name = "URL")]
    pub store: String,
    /// The point: this revision.
    #[arg(
        long,
        value_name = "N",
        conflicts_with = "to_time",
        required_unless_present = "to_time"
    )]
    pub to_revision: Option<i64>,
    /// The point: the newest delta written at or before this time (RFC 3339).
    #[arg(long, value_name = "RFC3339")]
    pub to_time: Option<String>,
    /// Only the keys that start with this (e.g. /registry/secrets/shop/).
    #[arg(long, value_name = "PREFIX", default_value = "")]
    pub prefix: String,
    #[command(flatten)]
    pub keys: ReadKeys,
    /// Where the full snapshot is read through (a scratch file as large as the database, removed
    /// after) [default: the system's temporary directory]
    #[arg(long, value_name = "DIR")]
    pub scratch_dir: Option<PathBuf>,
    /// Print JSON for tools.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    #[command(flatten)]
    pub point: PointArgs,
    #[command(flatten)]
    pub live: EtcdClientArgs,
    /// Compare with the newest backup instead of the live cluster.
    #[arg(long)]
    pub against_latest: bool,
}

#[derive(Debug, Args)]
pub struct UndoArgs {
    #[command(flatten)]
    pub point: PointArgs,
    #[command(flatten)]
    pub live: EtcdClientArgs,
    /// Print what would be written (the diff of the prefix) and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Write the keys someone changed since the diff read them, too (overwriting those changes).
    #[arg(long)]
    pub force: bool,
    /// Allow an empty --prefix: every key of the cluster goes back.
    #[arg(long)]
    pub all: bool,
}

/// Runs `diff`.
pub fn main_diff(args: DiffArgs) -> i32 {
    super::one_shot_quiet(diff(args))
}

/// Runs `undo`.
pub fn main_undo(args: UndoArgs) -> i32 {
    super::one_shot_quiet(undo(args))
}
