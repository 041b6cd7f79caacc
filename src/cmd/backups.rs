//! `etcd-warden backups copy|list|verify`: a store's backups copied, listed and checked (`--deep`:
//! each chain restored and opened by etcd).

use std::path::{Path, PathBuf};

use clap::Subcommand;
use serde_json::json;

use super::EX_USAGE;
use super::shared::{ReadKeys, keys, open_store, open_store_for_writing, private_temp_dir};
use crate::snapshot::verify;
use crate::store::Store;
use crate::store::crypt::Keys;
use crate::store::layout::Kind;

#[derive(Debug, Subcommand)]
pub enum BackupsCommand {
    /// Bring a copy store up to date: copy the backup objects (fulls, deltas, rollback points,
    /// etcd-backup-restore's) that it misses, byte for byte, fulls first. Coordination records
    /// (head, owner, restore plans) stay with the primary.
    Copy {
        /// The store the warden writes to.
        #[arg(long, value_name = "URL")]
        from: String,
        /// The copy (another provider, region or account).
        #[arg(long, value_name = "URL")]
        to: String,
        /// Say what would be copied, copy nothing.
        #[arg(long)]
        dry_run: bool,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// List full snapshots and their delta chains, ordered by revision.
    List {
        #[arg(long, env = "ETCD_WARDEN_STORE", value_name = "URL")]
        store: String,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Check every object's digest and every chain's continuity; exit 1 on any problem.
    Verify {
        #[arg(long, env = "ETCD_WARDEN_STORE", value_name = "URL")]
        store: String,
        #[arg(long)]
        json: bool,
        /// Also restore the newest chain into a scratch dir and check the revision etcd reports.
        #[arg(long)]
        deep: bool,
        /// The etcd binary for --deep (etcdutl/etcdctl beside it).
        #[arg(long, default_value = "etcd", value_name = "PATH")]
        etcd: String,
        /// With --identity-file, also decrypt and check the contents of encrypted backups.
        #[command(flatten)]
        keys: ReadKeys,
        /// kube-apiserver's EncryptionConfiguration: also read every full snapshot and say which
        /// keys its encrypted values (Secrets encrypted at rest) need, and whether this file holds
        /// them all (exit 1 when not).
        #[arg(long, value_name = "FILE")]
        kube_encryption_config: Option<PathBuf>,
    },
}

pub async fn backups(cmd: BackupsCommand) -> i32 {
    match cmd {
        BackupsCommand::List { store, json } => list(&store, json).await,
        BackupsCommand::Copy {
            from,
            to,
            dry_run,
            json,
        } => copy(&from, &to, dry_run, json).await,
        BackupsCommand::Verify {
            store,
            json,
            keys: read,
            kube_encryption_config,
            ..
        } => match keys(None, None, &read, None) {
            Ok(k) => {
                let code = verify_cmd(&store, json, k.clone()).await;
                match kube_encryption_config {
                    Some(config) => code.max(kube_keys_cmd(&store, &config, k).await),
                    None => code,
                }
            }
            Err(code) => code,
        },
    }
}

/// Under `backups list`: the cluster that owns the prefix, its members as its writer last recorded
/// them (what `cluster restore` restores by default), and a pending cluster restore plan.
/// `backups copy`: the copy store brought up to date with the objects it misses.
async fn copy(from: &str, to: &str, dry_run: bool, as_json: bool) -> i32 {
    let source = match open_store(from, Keys::default()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    // The copy may not exist yet (a new directory): created like a store `snapshot` writes to.
    let target = match open_store_for_writing(to, Keys::default()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let started = std::time::Instant::now();
    match crate::store::copy::copy_missing(&source, &target, dry_run).await {
        Ok(report) => {
            let seconds = started.elapsed().as_secs_f64();
            if as_json {
                let v =
                    json!({"from": from, "to": to, "dry_run": dry_run, "seconds": seconds, "report": report});
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else {
                for key in &report.copied {
                    println!("{} {key}", if dry_run { "would copy" } else { "copied" });
                }
                println!(
                    "{} {} objects ({} bytes) to {to} in {seconds:.1} s; {} were there already",
                    if dry_run { "would copy" } else { "copied" },
                    report.copied.len(),
                    report.bytes,
                    report.present
                );
            }
            0
        }
        Err(e) => {
            eprintln!(
                "etcd-warden: backups copy: {e} (the objects copied before it stay; run it again to finish)"
            );
            1
        }
    }
}

async fn print_cluster(store: &Store) {
    match store.get_owner().await {
        Ok(Some(o)) => {
            println!();
            println!(
                "cluster {:x} (claimed by {}), members as of {}:",
                o.cluster_id,
                o.claimed_by,
                humantime::format_rfc3339_seconds(
                    std::time::UNIX_EPOCH + std::time::Duration::from_millis(o.updated_ms)
                )
            );
            for m in &o.members {
                println!(
                    "  {:<16} {:x}{} {}",
                    if m.name.is_empty() {
                        "(not started)"
                    } else {
                        &m.name
                    },
                    m.id,
                    if m.is_learner { " learner" } else { "" },
                    m.peer_urls.join(",")
                );
            }
        }
        Ok(None) => {}
        Err(e) => eprintln!(
            "etcd-warden: cannot read the cluster record: {}",
            crate::telemetry::error_chain(&e)
        ),
    }
    if let Ok(Some(plan)) = store.current_plan().await
        && !plan.retired
    {
        let waiting = store.plan_waiting_for(&plan).await.unwrap_or_default();
        println!(
            "cluster restore plan {} pending: {} at revision {}; waiting for {}",
            plan.id,
            plan.full,
            plan.target_revision,
            if waiting.is_empty() {
                "nobody".to_owned()
            } else {
                waiting.join(", ")
            }
        );
    }
}

async fn list(url: &str, as_json: bool) -> i32 {
    let store = match open_store(url, Keys::default()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let result: Result<Vec<serde_json::Value>, String> = async {
        let chain_err = |e: crate::store::StoreError| crate::telemetry::error_chain(&e);
        let mut rows = Vec::new();
        let (fulls, chains) = store.catalog_with_meta().await.map_err(chain_err)?;
        // The release that wrote each full, from its header (one small ranged read per full).
        let mut versions = std::collections::HashMap::new();
        for (n, _) in &fulls {
            if matches!(n.layout, crate::store::layout::Layout::Warden)
                && let Ok(h) = crate::store::format::read_header(store.inner.as_ref(), &n.key(), &store.keys.signing).await
                && !h.etcd_version.is_empty()
            {
                versions.insert(n.key(), h.etcd_version);
            }
        }
        for (n, m) in &fulls {
            rows.push((n.chain(), 0, *n, m.size));
        }
        for (chain, deltas) in chains {
            for (n, m) in deltas {
                rows.push((Some(chain), 1, n, m.size));
            }
        }
        rows.sort_by_key(|(base, order, n, _)| (*base, *order, n.last_revision(), n.created_ms));
        let mut out: Vec<serde_json::Value> = rows
            .into_iter()
            .map(|(chain, _, n, size)| {
                let (kind, first, last, base, is_final) = match n.kind {
                    Kind::Full { revision, is_final } => ("full", revision, revision, revision, is_final),
                    Kind::Delta {
                        base, first, last, ..
                    } => ("delta", first, last, base, false),
                };
                json!({
                    "key": n.key(), "kind": kind, "base": base, "first": first, "last": last,
                    "chain": chain.map(|c| c.to_string()),
                    "created": humantime::format_rfc3339_millis(n.created()).to_string(),
                    "compression": n.compression_label(), "encryption": n.encryption.as_str(),
                    "layout": match n.layout {
                        crate::store::layout::Layout::Warden | crate::store::layout::Layout::Rollback => "warden",
                        crate::store::layout::Layout::Gbr(g) if g.v1_dir.is_some() => "gbr-v1",
                        crate::store::layout::Layout::Gbr(_) => "gbr-v2",
                    },
                    "final": is_final, "size": size,
                    "etcd_version": versions.get(&n.key()),
                })
            })
            .collect();
        // Rollback points: full snapshots taken before a newer etcd minor first started.
        for (n, h, size) in crate::store::rollback::list(&store).await? {
            let rev = n.last_revision();
            out.push(json!({
                "key": n.key(), "kind": "rollback", "base": rev, "first": rev,
                "last": rev, "chain": null,
                "created": humantime::format_rfc3339_millis(n.created()).to_string(),
                "compression": n.compression_label(), "encryption": n.encryption.as_str(),
                "layout": "warden", "final": false, "size": size,
                "etcd_version": h.etcd_version, "rollback_for": h.rollback_for,
            }));
        }
        Ok(out)
    }
    .await;
    match result {
        Ok(rows) => {
            if as_json {
                println!("{}", serde_json::to_string_pretty(&rows).unwrap_or_default());
            } else {
                println!(
                    "{:<8} {:>20} {:>20} {:<19} {:>12} {:<7}  KEY",
                    "KIND", "FIRST", "LAST", "CREATED", "SIZE", "ETCD"
                );
                for r in rows {
                    let created = r["created"].as_str().unwrap_or_default();
                    println!(
                        "{:<8} {:>20} {:>20} {:<19} {:>12} {:<7}  {}",
                        format!(
                            "{}{}",
                            r["kind"].as_str().unwrap_or_default(),
                            if r["final"] == true { "*" } else { "" }
                        ),
                        r["first"].as_i64().unwrap_or(0),
                        r["last"].as_i64().unwrap_or(0),
                        &created[..created.len().min(19)],
                        r["size"].as_u64().unwrap_or(0),
                        r["etcd_version"].as_str().unwrap_or("-"),
                        r["key"].as_str().unwrap_or_default()
                    );
                }
                print_cluster(&store).await;
            }
            0
        }
        Err(e) => {
            eprintln!("etcd-warden: {e}");
            1
        }
    }
}

async fn verify_cmd(url: &str, as_json: bool, keys: Keys) -> i32 {
    let store = match open_store(url, keys) {
        Ok(s) => s,
        Err(code) => return code,
    };
    match verify::verify_store(&store).await {
        Ok(report) => {
            if as_json {
                println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
            } else {
                for o in &report.objects {
                    match &o.error {
                        None => println!("ok    {}", o.key),
                        Some(e) => println!("FAIL  {}: {e}", o.key),
                    }
                }
                for e in &report.chain_errors {
                    println!("FAIL  {e}");
                }
                for n in &report.notes {
                    println!("note  {n}");
                }
                let bad = report.objects.iter().filter(|o| !o.ok).count() + report.chain_errors.len();
                println!("{} objects checked, {bad} problems", report.objects.len());
            }
            if report.ok() { 0 } else { 1 }
        }
        Err(e) => {
            eprintln!("etcd-warden: {}", crate::telemetry::error_chain(&e));
            1
        }
    }
}

/// `backups verify --kube-encryption-config`: each full snapshot read into a scratch file, the key
/// names its newest values need (Secrets encrypted at rest) against those the configuration holds.
/// 0 when every full can be decrypted with it, 1 when one cannot, 64 for a file that is not an
/// EncryptionConfiguration.
async fn kube_keys_cmd(url: &str, config: &Path, keys: Keys) -> i32 {
    let held = match crate::kube::encryption::config_keys(config) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("etcd-warden: --kube-encryption-config {e}");
            return EX_USAGE;
        }
    };
    let store = match open_store(url, keys) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let fulls = match store.catalog().await {
        Ok((fulls, _)) => fulls,
        Err(e) => {
            eprintln!("etcd-warden: {}", crate::telemetry::error_chain(&e));
            return 1;
        }
    };
    // One full at a time, in a scratch file removed after each, in a directory only this process
    // may enter (a decrypted database must not land where another user can read or redirect it).
    let scratch = match private_temp_dir("etcd-warden-kube-keys") {
        Ok(d) => d,
        Err(e) => {
            eprintln!("etcd-warden: create a private scratch dir: {e}");
            return 1;
        }
    };
    let path = scratch.join("full.db");
    let mut code = 0;
    for full in &fulls {
        let key = full.key();
        let needed = match verify::read_full_to_file(
            &store,
            full,
            &path,
            &crate::telemetry::Progress::default(),
        )
        .await
        {
            Ok(_) => crate::kube::needs::needed_in_file(&path).map(|n| n.needed),
            Err(e) => Err(e.to_string()),
        };
        let _ = std::fs::remove_file(&path);
        match needed {
            Ok(needed) if needed.is_empty() => println!("keys  {key}: no value encrypted at rest"),
            Ok(needed) => {
                let missing: Vec<&String> = needed.keys().filter(|k| !held.contains(*k)).collect();
                let list = needed
                    .iter()
                    .map(|(k, n)| format!("{k} ({n})"))
                    .collect::<Vec<_>>()
                    .join(", ");
                if missing.is_empty() {
                    println!("keys  {key}: needs {list}: all in {}", config.display());
                } else {
                    code = 1;
                    println!(
                        "FAIL  {key}: needs {list}; {} not in {}: a restore of it cannot be decrypted with that file",
                        missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
                        config.display()
                    );
                }
            }
            Err(e) => {
                code = 1;
                println!("FAIL  {key}: cannot read its database for encrypted values: {e}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    code
}

/// `backups verify --deep`: the shallow checks, then a real restore of the newest chain into a
/// scratch dir beside the system temp dir, then etcd started on it: the revision it reports must
/// be the restored one, and its HashKV is printed (compare it with `etcdctl endpoint hashkv`).
pub async fn verify_deep(
    store_url: String,
    etcd: String,
    read: ReadKeys,
    kube_encryption_config: Option<PathBuf>,
    reaper: crate::process::pid1::Reaper,
) -> i32 {
    let keys = match keys(None, None, &read, None) {
        Ok(k) => k,
        Err(code) => return code,
    };
    let mut shallow = verify_cmd(&store_url, false, keys.clone()).await;
    if shallow == EX_USAGE {
        return shallow;
    }
    if let Some(config) = &kube_encryption_config {
        match kube_keys_cmd(&store_url, config, keys.clone()).await {
            EX_USAGE => return EX_USAGE,
            code => shallow = shallow.max(code),
        }
    }
    let store = match open_store(&store_url, keys) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let etcd = match super::shared::resolve_program_str(&etcd) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("etcd-warden: --etcd: {e}");
            return EX_USAGE;
        }
    };
    let scratch = match tempfile_dir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("etcd-warden: create a scratch dir: {e}");
            return 1;
        }
    };
    let opts = crate::restore::RestoreOptions::scratch(scratch.join("data"), etcd);
    let code = match crate::restore::restore(&store, &opts, &reaper).await {
        Ok(r) => {
            println!(
                "deep: restored {} (+{} deltas) to revision {} in {:.1}s",
                r.full, r.deltas, r.revision, r.seconds
            );
            for (key, why) in &r.skipped {
                println!("FAIL  deep: newest chain unusable, {key}: {why}");
            }
            let opened = crate::restore::check::open_with_etcd(
                &reaper,
                &opts.etcd,
                &opts.data_dir,
                &opts.name,
                r.revision,
                None,
            )
            .await;
            match &opened {
                Ok(hash) => println!("deep: etcd opened it at revision {}, HashKV {hash}", r.revision),
                Err(e) => println!("FAIL  deep: {e}"),
            }
            if r.skipped.is_empty() && shallow == 0 && opened.is_ok() {
                0
            } else {
                1
            }
        }
        Err(e) => {
            println!("FAIL  deep: {}", crate::telemetry::error_chain(&e));
            1
        }
    };
    let _ = std::fs::remove_dir_all(&scratch);
    code
}

fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    private_temp_dir("etcd-warden-verify")
}

/// Runs a `backups` command (`verify --deep` starts etcd, so it needs the reaper).
pub fn main(cmd: BackupsCommand) -> i32 {
    match cmd {
        BackupsCommand::Verify {
            store,
            deep: true,
            etcd,
            keys,
            kube_encryption_config,
            ..
        } => super::with_reaper(|reaper, _signals| {
            verify_deep(store, etcd, keys, kube_encryption_config, reaper)
        }),
        cmd => super::one_shot(backups(cmd)),
    }
}
