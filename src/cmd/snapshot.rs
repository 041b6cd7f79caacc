//! `etcd-warden snapshot`: one full snapshot of a running etcd into the store, through the same
//! stream, object format and verification as `run`.

use std::path::PathBuf;

use clap::Args;

use super::shared::{EtcdClientArgs, connect, keys, open_store_for_writing};
use crate::snapshot::full;
use crate::store::layout::Compression;

#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// Where the snapshot goes: file:///dir, s3://bucket/prefix, gs://bucket/prefix, az://container/prefix
    #[arg(long, env = "ETCD_WARDEN_STORE", value_name = "URL")]
    pub store: String,
    #[command(flatten)]
    pub client: EtcdClientArgs,
    #[arg(long, value_enum, default_value = "zstd")]
    pub compression: Compression,
    /// Encrypt with age to these recipients (age1…, comma-separated).
    #[arg(long, env = "ETCD_WARDEN_ENCRYPT_TO", value_name = "RECIPIENTS")]
    pub encrypt_to: Option<String>,
    /// Encrypt with age to the recipients in this file.
    #[arg(long, env = "ETCD_WARDEN_ENCRYPT_TO_FILE", value_name = "FILE")]
    pub encrypt_to_file: Option<PathBuf>,
    /// Sign the snapshot with this Ed25519 private key (PEM), as `run --sign-key` signs.
    #[arg(long, env = "ETCD_WARDEN_SIGN_KEY", value_name = "FILE")]
    pub sign_key: Option<PathBuf>,
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
        full::FullOptions::default(),
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

/// Runs `snapshot`.
pub fn main(args: SnapshotArgs) -> i32 {
    super::one_shot(snapshot(args))
}
