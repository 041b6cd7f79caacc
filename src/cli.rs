//! The one-shot commands: `snapshot`, `backups list`, `backups verify`. They reuse the same code
//! paths as `run` (the same snapshot stream, object format and verification).

use std::time::Duration;

use serde_json::json;

use crate::config::{BackupsCommand, SnapshotArgs};
use crate::etcd::client::{ClientConfig, TlsFiles};
use crate::snapshot::{full, verify};
use crate::store::crypt::Keys;
use crate::store::layout::Kind;
use crate::store::{Store, StoreUrl};
use std::path::{Path, PathBuf};

/// Bad usage or configuration.
pub const EX_USAGE: i32 = 64;

/// The store of a command that reads it (list, verify, restore, cluster restore): a local
/// directory that does not exist is an error (a typo), never created.
pub(crate) fn open_store(url: &str, keys: Keys) -> Result<Store, i32> {
    if let Ok(StoreUrl::File { path }) = url.parse::<StoreUrl>()
        && !path.is_dir()
    {
        eprintln!(
            "etcd-warden: --store {url}: {} is not a directory, so it holds no backups (check the path; nothing was created)",
            path.display()
        );
        return Err(EX_USAGE);
    }
    open_store_for_writing(url, keys)
}

/// The store of `snapshot`, which creates a local directory that does not exist yet.
fn open_store_for_writing(url: &str, keys: Keys) -> Result<Store, i32> {
    let parsed: StoreUrl = url.parse().map_err(|e| {
        eprintln!("etcd-warden: --store {e}");
        EX_USAGE
    })?;
    Store::open(&parsed).map(|s| s.with_keys(keys)).map_err(|e| {
        eprintln!("etcd-warden: {}", crate::telemetry::error_chain(&e));
        // A store that cannot be configured (no credentials, a bad setting) is the user's to fix.
        match e {
            crate::store::StoreError::NoCredentials { .. } | crate::store::StoreError::Configure { .. } => {
                EX_USAGE
            }
            _ => 1,
        }
    })
}

/// The keys a one-shot command was given; bad ones are usage errors.
pub(crate) fn keys(
    to: Option<&String>,
    to_file: Option<&PathBuf>,
    read: &crate::config::ReadKeys,
    sign_key: Option<&Path>,
) -> Result<Keys, i32> {
    crate::config::keys(
        to.map(std::slice::from_ref).unwrap_or_default(),
        to_file.map(std::slice::from_ref).unwrap_or_default(),
        read,
        sign_key,
    )
    .map_err(|e| {
        eprintln!("etcd-warden: {e}");
        EX_USAGE
    })
}

/// A client of `endpoints` (comma-separated URLs), with TLS files for https; the endpoints too.
pub(crate) async fn connect(
    args: &crate::config::EtcdClientArgs,
) -> Result<(Vec<String>, etcd_client::Client), i32> {
    connect_to(args, &args.endpoints).await
}

/// `connect`, to `endpoints` instead of the arguments' own (one member of them).
pub(crate) async fn connect_to(
    args: &crate::config::EtcdClientArgs,
    endpoints: &str,
) -> Result<(Vec<String>, etcd_client::Client), i32> {
    let (ca, cert, key) = (&args.cacert, &args.cert, &args.key);
    if cert.is_some() != key.is_some() {
        eprintln!("etcd-warden: --etcd-cert and --etcd-key go together (give both or neither)");
        return Err(EX_USAGE);
    }
    let user = match (&args.etcd_user, &args.etcd_password_file) {
        (None, None) => None,
        (Some(name), Some(password_file)) => {
            if let Err(e) = std::fs::read_to_string(password_file) {
                eprintln!(
                    "etcd-warden: --etcd-password-file {}: {e} (a file holding the password of --etcd-user)",
                    password_file.display()
                );
                return Err(EX_USAGE);
            }
            Some(crate::etcd::client::UserAuth {
                name: name.clone(),
                password_file: password_file.clone(),
            })
        }
        _ => {
            eprintln!("etcd-warden: --etcd-user and --etcd-password-file go together (give both or neither)");
            return Err(EX_USAGE);
        }
    };
    let list: Vec<String> = endpoints
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    if list.is_empty() || list.iter().any(|e| url::Url::parse(e).is_err()) {
        eprintln!(
            "etcd-warden: --endpoints {endpoints:?}: not a list of URLs (write e.g. http://127.0.0.1:2379)"
        );
        return Err(EX_USAGE);
    }
    let tls = list.iter().any(|e| e.starts_with("https://")).then(|| TlsFiles {
        ca: ca.clone(),
        identity: cert.clone().zip(key.clone()),
    });
    let cfg = ClientConfig {
        endpoints: list.clone(),
        tls,
        timeout: Duration::from_secs(10),
        user,
    };
    let unreachable = |why: String| {
        eprintln!(
            "etcd-warden: etcd at {endpoints} does not answer ({why}): check --endpoints (https needs --etcd-ca, and --etcd-cert with --etcd-key when etcd asks for a client certificate) and that etcd runs; nothing was written"
        );
        1
    };
    let mut c = cfg
        .connect()
        .await
        .map_err(|e| unreachable(concise(&crate::telemetry::error_chain(&e))))?;
    // The client connects lazily: one status asked now says whether anything answers, before
    // a command creates anything.
    match tokio::time::timeout(Duration::from_secs(10), c.status()).await {
        Ok(Ok(_)) => Ok((list, c)),
        Ok(Err(e)) => Err(unreachable(concise(&crate::telemetry::error_chain(&e)))),
        Err(_) => Err(unreachable("no answer within 10 s".into())),
    }
}

/// What a gRPC error chain says, in a few words: the causes operators meet, else the chain.
fn concise(chain: &str) -> String {
    let lower = chain.to_lowercase();
    if lower.contains("connection refused") {
        "connection refused".into()
    } else if lower.contains("certificate") || lower.contains("tls") || lower.contains("handshake") {
        format!("TLS: {chain}")
    } else if lower.contains("deadline") || lower.contains("timed out") {
        "no answer in time".into()
    } else if lower.contains("dns error") || lower.contains("failed to lookup") {
        "the host name does not resolve".into()
    } else {
        chain.to_owned()
    }
}

/// `etcd-warden downgrade VERSION`: etcd's own downgrade, validated, enabled and waited for.
pub async fn downgrade(args: crate::config::DowngradeArgs) -> i32 {
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

pub async fn snapshot(args: SnapshotArgs) -> i32 {
    let keys = match keys(
        args.encrypt_to.as_ref(),
        args.encrypt_to_file.as_ref(),
        &Default::default(),
        args.sign_key.as_deref(),
    ) {
        Ok(k) => k,
        Err(code) => return code,
    };
    // etcd first: a command that cannot reach it creates nothing in the store.
    let mut client = match connect(&args.client).await {
        Ok(c) => c.1,
        Err(code) => return code,
    };
    let store = match open_store_for_writing(&args.store, keys) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let progress = crate::telemetry::Progress::terminal();
    let result = full::take_full(
        &mut client,
        &store,
        args.compression,
        false,
        None,
        None,
        &progress,
    )
    .await;
    progress.done();
    match result {
        Ok(r) => {
            println!(
                "{}\trevision {}\t{} bytes from etcd\t{} bytes stored\t{:.2}s",
                r.name.key(),
                r.name.last_revision(),
                r.raw_bytes,
                r.stored_bytes,
                r.duration.as_secs_f64()
            );
            0
        }
        Err(e) => {
            eprintln!(
                "etcd-warden: snapshot failed: {}",
                crate::telemetry::error_chain(&e)
            );
            1
        }
    }
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

/// The newest rollback point of data written by etcd `version` (`3.5` or `3.5.30`); exit 64
/// naming the points there are when none matches.
async fn rollback_point(store: &Store, version: &str) -> Result<crate::store::SnapshotName, i32> {
    let points = crate::store::rollback::list(store).await.map_err(|e| {
        eprintln!("etcd-warden: {e}");
        1
    })?;
    let matches = |v: &str| v == version || v.starts_with(&format!("{version}."));
    match points.iter().rev().find(|(_, h, _)| matches(&h.etcd_version)) {
        Some((name, h, _)) => {
            println!(
                "rollback point {} of data written by etcd {} (taken before etcd {} started on it), revision {}",
                name.key(),
                h.etcd_version,
                h.rollback_for.as_deref().unwrap_or("?"),
                name.last_revision()
            );
            Ok(*name)
        }
        None => {
            let there: Vec<String> = points
                .iter()
                .map(|(n, h, _)| format!("{} (revision {})", h.etcd_version, n.last_revision()))
                .collect();
            eprintln!(
                "etcd-warden: --etcd-version {version}: the store holds no rollback point of data written by etcd {version} ({}); `backups list` shows them; nothing was changed",
                if there.is_empty() {
                    "it holds none".to_owned()
                } else {
                    format!("it holds: {}", there.join(", "))
                }
            );
            Err(EX_USAGE)
        }
    }
}

/// What a rollback loses: the revisions the store holds past the point, and when they were written.
async fn print_rollback_loss(store: &Store, point: &crate::store::SnapshotName) {
    use crate::restore::{Target, plan};
    let newest = store.catalog().await.ok().and_then(|(fulls, chains)| {
        let cand = plan::candidates(
            &fulls,
            &|c| chains.get(&c).cloned().unwrap_or_default(),
            Target::Latest,
        )
        .into_iter()
        .next()?;
        let last_created = cand.deltas.last().unwrap_or(&cand.full).created_ms;
        Some((cand.target_revision, last_created))
    });
    match newest {
        Some((rev, at)) if rev > point.last_revision() => println!(
            "LOST by this rollback: {} revisions ({}..={rev}), written between {} and {} (the newest backup); they stay in the store",
            rev - point.last_revision(),
            point.last_revision() + 1,
            humantime::format_rfc3339_seconds(point.created()),
            humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(at)),
        ),
        _ => println!("LOST by this rollback: nothing (the store holds no revision past the rollback point)"),
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
            Ok(_) => crate::kube::encryption::needed_in_db(&path),
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

/// `--to-revision` / `--to-time` as a restore target; exit 64 (said on stderr) for bad input.
pub(crate) fn target_of(
    to_revision: Option<i64>,
    to_time: Option<&str>,
) -> Result<crate::restore::Target, i32> {
    use crate::restore::Target;
    match (to_revision, to_time) {
        (Some(r), _) if r < 1 => {
            eprintln!("etcd-warden: --to-revision {r}: revisions start at 1");
            Err(EX_USAGE)
        }
        (Some(r), _) => Ok(Target::Revision(r)),
        (None, Some(t)) => match crate::restore::execute::parse_time(t) {
            Ok(ms) => Ok(Target::Time(ms)),
            Err(e) => {
                eprintln!("etcd-warden: --to-time {e}");
                Err(EX_USAGE)
            }
        },
        (None, None) => Ok(Target::Latest),
    }
}

/// Whether a restore may write into `dir`: absent, or an empty directory.
fn restorable_into(dir: &Path) -> Result<(), &'static str> {
    match std::fs::metadata(dir) {
        Err(_) => Ok(()),
        Ok(m) if !m.is_dir() => Err("is not a directory"),
        Ok(_) if crate::etcd::dirs::is_empty_dir(dir) => Ok(()),
        Ok(_) => Err("exists and is not empty"),
    }
}

/// `cluster restore`: writes the plan every member's warden restores by.
pub async fn cluster_restore(args: crate::config::ClusterRestoreArgs) -> i32 {
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

/// `restore` restored less than the store's newest backup for the target (corrupt or missing
/// objects): the data dir holds the newest consistent point; `--accept-older` makes this exit 0.
pub const EX_OLDER: i32 = 2;

/// `etcd-warden restore`: offline restore into a new data dir. Ctrl-C stops it and leaves the target
/// untouched (the work dir beside it is removed as the restore's future is dropped).
pub async fn restore(
    args: crate::config::RestoreArgs,
    reaper: crate::process::pid1::Reaper,
    mut signals: tokio::sync::mpsc::UnboundedReceiver<crate::process::signals::SignalEvent>,
) -> i32 {
    use crate::restore::{RestoreOptions, Target};
    let keys = match keys(None, None, &args.keys, None) {
        Ok(k) => k,
        Err(code) => return code,
    };
    let store = match open_store(&args.store, keys) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let store = store.with_gbr_lease_ttl(args.gbr_lease_ttl);
    for (flag, dir) in
        std::iter::once(("--data-dir", &args.data_dir)).chain(args.wal_dir.iter().map(|w| ("--wal-dir", w)))
    {
        if let Err(why) = restorable_into(dir) {
            eprintln!(
                "etcd-warden: {flag} {dir:?}: {why} (restore into a new or empty directory; nothing was changed)"
            );
            return EX_USAGE;
        }
    }
    let etcd = match crate::config::resolve_program_str(&args.etcd) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("etcd-warden: --etcd: {e}");
            return EX_USAGE;
        }
    };
    let target = match &args.etcd_version {
        Some(v) => match rollback_point(&store, v).await {
            Ok(point) => Target::Rollback(point),
            Err(code) => return code,
        },
        None => match target_of(args.to_revision, args.to_time.as_deref()) {
            Ok(t) => t,
            Err(code) => return code,
        },
    };
    if let Err(e) = bump_of(args.bump_revision, args.mark_compacted) {
        eprintln!("etcd-warden: {e}; nothing was changed");
        return EX_USAGE;
    }
    let data_dir = if args.data_dir.is_absolute() {
        args.data_dir.clone()
    } else {
        std::env::current_dir().unwrap_or_default().join(&args.data_dir)
    };
    let opts = RestoreOptions {
        progress: crate::telemetry::Progress::terminal(),
        data_dir,
        wal_dir: args
            .wal_dir
            .as_ref()
            .map(|w| std::env::current_dir().unwrap_or_default().join(w)),
        etcd,
        tool: args.etcdutl.clone(),
        name: args.name.clone(),
        initial_cluster: args.initial_cluster.clone(),
        initial_advertise_peer_urls: args.initial_advertise_peer_urls.clone(),
        initial_cluster_token: args.initial_cluster_token.clone(),
        target,
        bump_revision: args.bump_revision,
        bump_clears_store: true,
        store_wait: args.store_wait,
    };
    let work = crate::restore::restore(&store, &opts, &reaper);
    tokio::pin!(work);
    loop {
        tokio::select! {
            r = &mut work => {
                opts.progress.done();
                return match r {
                    Ok(report) => {
                        println!(
                            "restored {} at revision {} from {} (+{} deltas, {} revisions applied) in {:.1}s",
                            opts.data_dir.display(), report.backed_up_revision, report.full, report.deltas, report.revisions_applied, report.seconds
                        );
                        if report.bumped_by > 0 {
                            println!(
                                "revision bumped by {} to {}; every revision up to it is marked compacted",
                                report.bumped_by, report.revision
                            );
                        }
                        if let Target::Rollback(point) = target {
                            print_rollback_loss(&store, &point).await;
                        }
                        if target != Target::Latest {
                            match store.catalog().await.ok().and_then(|(fulls, chains)| {
                                crate::restore::plan::candidates(&fulls, &|c| chains.get(&c).cloned().unwrap_or_default(), Target::Latest)
                                    .first()
                                    .map(|c| c.target_revision)
                            }) {
                                Some(newest) if report.revision > newest => println!(
                                    "NOTE: revision {} is above the store's newest backup ({newest}): `etcd-warden run` on this data dir with this store keeps it, and its next full snapshot starts a new chain.",
                                    report.revision
                                ),
                                _ => println!(
                                    "NOTE: this is older than the store's newest backup. Restore again without --bump-revision 0 (or with a bump above the newest backup's revision minus this one) before `etcd-warden run` with this store, or use a new --store: otherwise its start-up check would find the data dir behind and restore the newest backup over it (the dir would be kept aside, not lost)."
                                ),
                            }
                        }
                        for (key, why) in &report.skipped {
                            println!("WARNING: skipped {key}: {why}");
                        }
                        if report.backed_up_revision < report.target_revision {
                            println!(
                                "WARNING: restored revision {} only; the store's newest backup for the target is revision {} (the objects above were corrupt or missing)",
                                report.backed_up_revision, report.target_revision
                            );
                            if !args.accept_older {
                                eprintln!(
                                    "etcd-warden: restored less than asked for (exit {EX_OLDER}); {} holds revision {}: pass --accept-older to take it as the result",
                                    opts.data_dir.display(),
                                    report.backed_up_revision
                                );
                                return EX_OLDER;
                            }
                        }
                        0
                    }
                    Err(e @ crate::restore::execute::RestoreError::Tool { .. }) => {
                        eprintln!("etcd-warden: {e}; nothing was changed");
                        EX_USAGE
                    }
                    Err(e) => {
                        eprintln!("etcd-warden: restore failed: {}", crate::telemetry::error_chain(&e));
                        1
                    }
                };
            }
            Some(ev) = signals.recv() => {
                if let crate::process::signals::SignalEvent::Stop(sig) = ev {
                    eprintln!("etcd-warden: {sig}: restore interrupted; {} was not changed", opts.data_dir.display());
                    return 130;
                }
            }
        }
    }
}

/// `backups verify --deep`: the shallow checks, then a real restore of the newest chain into a
/// scratch dir beside the system temp dir, then etcd started on it: the revision it reports must
/// be the restored one, and its HashKV is printed (compare it with `etcdctl endpoint hashkv`).
pub async fn verify_deep(
    store_url: String,
    etcd: String,
    read: crate::config::ReadKeys,
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
    let etcd = match crate::config::resolve_program_str(&etcd) {
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

/// A new directory in the system's temporary directory that only this user may enter (0700),
/// under a name nobody can guess, created exclusively: a name another user created first (a
/// directory, a file or a symlink) is never used, another is drawn.
fn private_temp_dir(prefix: &str) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let mut last = None;
    for _ in 0..16 {
        let dir = std::env::temp_dir().join(format!("{prefix}-{:016x}", fastrand::u64(..)));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free name")))
}

/// `--bump-revision N` (the compaction mark implied) and `--mark-compacted` as `restore` and
/// `cluster restore` take them.
fn bump_of(bump: u64, mark_compacted: bool) -> Result<(), String> {
    if i64::try_from(bump).is_err() {
        return Err(format!(
            "--bump-revision {bump}: too large for etcd's 64-bit revisions (write at most 9223372036854775807)"
        ));
    }
    if bump == 0 && mark_compacted {
        return Err(
            "--mark-compacted with --bump-revision 0: there is nothing to mark (drop --mark-compacted for an exact copy, or give a bump above 0)"
                .to_owned(),
        );
    }
    Ok(())
}
