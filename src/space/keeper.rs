//! The etcd requests of a repair: compaction to a revision the backups hold, leadership moved off
//! a member before its defragmentation, and the NOSPACE alarms disarmed.

use etcd_client::{AlarmAction, AlarmOptions, AlarmType, Client, CompactionOptions};

/// Compacts to `revision`; `physical`: the freed pages are free when it answers (a repair
/// defragments next), else etcd frees them in the background as its own auto-compaction does.
/// `Ok(None)`: etcd had already compacted there or beyond.
pub async fn compact_to(client: &mut Client, revision: i64, physical: bool) -> Result<Option<i64>, String> {
    let opts = physical.then(|| CompactionOptions::new().with_physical());
    match client.compact(revision, opts).await {
        Ok(_) => Ok(Some(revision)),
        Err(e) if e.to_string().contains("compacted") => Ok(None),
        Err(e) => Err(format!("compact to revision {revision}: {e}")),
    }
}

/// Moves leadership from the member behind `client` (the leader) to `target`.
pub async fn move_leader(client: &mut Client, target: u64) -> Result<(), String> {
    client
        .move_leader(target)
        .await
        .map(drop)
        .map_err(|e| format!("move leadership to {target:x}: {e}"))
}

/// Disarms every NOSPACE alarm; how many there were.
pub async fn disarm_nospace(client: &mut Client) -> Result<usize, String> {
    let alarms = client
        .alarm(AlarmAction::Get, AlarmType::None, None)
        .await
        .map_err(|e| format!("list the alarms: {e}"))?;
    let members: Vec<u64> = alarms
        .alarms()
        .iter()
        .filter(|a| a.alarm() == AlarmType::Nospace)
        .map(|a| a.member_id())
        .collect();
    for member in &members {
        let mut opts = AlarmOptions::new();
        opts.with_member(*member);
        client
            .alarm(AlarmAction::Deactivate, AlarmType::Nospace, Some(opts))
            .await
            .map_err(|e| format!("disarm NOSPACE of member {member:x}: {e}"))?;
    }
    Ok(members.len())
}
