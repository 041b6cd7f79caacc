//! The read side of the warden: watch receivers and counters that `/status`, `/metrics`, `/readyz`
//! and the systemd notifier all read. Nothing here is written through a lock across an await.

use std::time::SystemTime;

use serde_json::json;
use tokio::sync::watch;

use crate::backup::BackupStatus;
use crate::etcd::Health;
use crate::etcd::supervisor::{ChildState, Phase};
use crate::ownership::OwnershipStatus;
use crate::ownership::fence::FenceStatus;
use crate::process::pid1::{InitRole, Reaper};
use crate::telemetry::{Heartbeat, opt_unix_seconds::to_unix};

/// Shared, read-only view of the running warden.
#[derive(Clone)]
pub struct Shared {
    pub child: watch::Receiver<ChildState>,
    pub health: watch::Receiver<Health>,
    pub backup: watch::Receiver<BackupStatus>,
    /// `--copy-to`: each copy store's progress.
    pub copies: crate::copies::Copies,
    pub drill: watch::Receiver<crate::backup::drill::DrillStatus>,
    /// Set the moment a graceful stop begins: readiness goes 503 before anything else happens.
    pub shutting_down: watch::Receiver<bool>,
    /// What the start-up validation or restore is doing; `None` once etcd may start.
    pub restoring: watch::Receiver<Option<String>>,
    pub ownership: watch::Receiver<OwnershipStatus>,
    pub fence: watch::Receiver<FenceStatus>,
    pub restores: watch::Receiver<crate::startup::RestoreStats>,
    /// A cluster member's membership state when it holds etcd back: quorum lost, a repair under
    /// way, a learner catching up. `None` otherwise (and always for a single member).
    pub member: watch::Receiver<Option<String>>,
    /// `etcd-warden standby`: how far behind, and the promotion (`None`: not a standby).
    pub standby: watch::Receiver<Option<crate::standby::StandbyStatus>>,
    /// Why the last `ctl leave` was refused (`None`: none was).
    pub leave_refused: watch::Receiver<Option<String>>,
    pub reaper: Reaper,
    pub role: InitRole,
    /// What `etcd --version` said before the first start (the server's own answer wins once seen).
    pub etcd_binary_version: Option<crate::etcd::version::Version>,
    /// What the upgrade-path check said at start, when it had something to say.
    pub upgrade: Option<String>,
    pub started_at: SystemTime,
    pub store: String,
    pub supervisor_heartbeat: Heartbeat,
    pub health_heartbeat: Heartbeat,
}

impl Shared {
    pub fn readiness(&self) -> Result<(), String> {
        crate::serve::readiness::evaluate(&self.child.borrow(), &self.health.borrow(), self.gate())
    }

    /// What holds etcd back regardless of its health, most decisive first.
    fn gate(&self) -> Option<String> {
        if *self.shutting_down.borrow() {
            return Some("etcd-warden is shutting down".to_owned());
        }
        if let Some(r) = self.fence.borrow().not_ready_reason() {
            return Some(r);
        }
        if let Some(r) = self.ownership.borrow().not_ready_reason() {
            return Some(r);
        }
        if let Some(m) = self.member.borrow().clone() {
            return Some(m);
        }
        if let Some(r) = self.standby.borrow().as_ref().and_then(|s| s.not_ready_reason()) {
            return Some(r);
        }
        self.restoring
            .borrow()
            .as_ref()
            .map(|what| format!("restoring: {what}"))
    }

    /// The warden's phase as operators read it (status line, /status).
    pub fn phase(&self) -> &'static str {
        if *self.shutting_down.borrow() && self.child.borrow().phase != Phase::Stopped {
            return "stopping";
        }
        if self.fence.borrow().fenced_since.is_some() {
            return "fenced";
        }
        if !self.ownership.borrow().may_serve {
            return "not-owner";
        }
        if self
            .standby
            .borrow()
            .as_ref()
            .is_some_and(|s| s.state != crate::standby::State::Promoted)
        {
            return "standby";
        }
        if self.restoring.borrow().is_some() {
            return "restoring";
        }
        let child = self.child.borrow();
        match child.phase {
            Phase::Idle => "starting",
            Phase::Running if self.readiness().is_ok() => "running",
            Phase::Running if child.restarts == 0 => "starting",
            Phase::Running | Phase::Backoff | Phase::Delayed => "restarting",
            Phase::Stopping => "stopping",
            Phase::Fencing | Phase::Fenced => "fenced",
            Phase::Stopped => "stopped",
        }
    }

    /// `/livez`: every loop of the warden has beaten recently.
    pub fn liveness(&self) -> Result<(), String> {
        let limit = std::time::Duration::from_secs(30);
        for (name, hb) in [
            ("supervisor", &self.supervisor_heartbeat),
            ("health", &self.health_heartbeat),
        ] {
            if hb.age() > limit {
                return Err(format!("{name} loop silent for {}s", hb.age().as_secs()));
            }
        }
        Ok(())
    }

    /// `.space`: this member's database sizes, quota, alarm and forecast (the health loop's), and
    /// the NOSPACE repairs this warden ran as the writer (`crate::space`).
    fn space_json(&self, health: &crate::etcd::health::Health) -> serde_json::Value {
        let b = self.backup.borrow();
        let mut v = serde_json::to_value(&health.space).unwrap_or_default();
        if let Some(obj) = v.as_object_mut() {
            obj.insert("repairs_total".into(), b.space_repairs_total.into());
            obj.insert(
                "history_compactions_total".into(),
                b.space_compactions_total.into(),
            );
            obj.insert(
                "history_compacted_revision".into(),
                b.space_compacted_revision.into(),
            );
            obj.insert(
                "last_repair".into(),
                serde_json::to_value(&b.last_space_repair).unwrap_or_default(),
            );
        }
        v
    }

    fn backup_json(&self) -> serde_json::Value {
        let b = self.backup.borrow().clone();
        let since = b
            .last_success_at
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .map(|d| d.as_secs_f64());
        let mut v = serde_json::to_value(&b).unwrap_or_default();
        v["store"] = json!(self.store);
        v["restore_drill"] = serde_json::to_value(&*self.drill.borrow()).unwrap_or_default();
        v["seconds_since_last_success"] = json!(since);
        v
    }

    /// `.copies`: one entry per `--copy-to` store, with its lag.
    fn copies_json(&self) -> serde_json::Value {
        let now = SystemTime::now();
        self.copies
            .statuses()
            .into_iter()
            .map(|c| {
                let mut v = serde_json::to_value(&c).unwrap_or_default();
                v["lag_revisions"] = json!(c.lag_revisions());
                v["lag_seconds"] = json!(c.lag_seconds(now));
                v
            })
            .collect()
    }

    fn ownership_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(&*self.ownership.borrow()).unwrap_or_default();
        let fence = self.fence.borrow().clone();
        v["fenced_since"] = json!(fence.fenced_since.map(to_unix));
        v["fence"] = serde_json::to_value(&fence).unwrap_or_default();
        v
    }

    /// `/status` as JSON.
    pub fn status_json(&self) -> serde_json::Value {
        let child = self.child.borrow().clone();
        let health = self.health.borrow().clone();
        let ready = self.readiness();
        let current = health.incarnation == child.incarnation && child.phase == Phase::Running;
        let version = health
            .version
            .as_deref()
            .and_then(crate::etcd::version::Version::parse)
            .or(self.etcd_binary_version);
        let known_issues = version
            .map(crate::etcd::version::known_issues)
            .unwrap_or_default();
        json!({
            "phase": self.phase(),
            "ready": ready.is_ok(),
            "not_ready_reason": ready.err(),
            "etcd": {
                "pid": child.pid,
                "phase": child.phase,
                "restarts": child.restarts,
                "incarnation": child.incarnation,
                "started_at": child.started_at.map(to_unix),
                "last_exit": child.last_exit,
                "backoff_seconds": child.backoff_seconds,
                "held_back": child.held_back,
                "healthy": current && health.healthy,
                "health_reason": health.reason,
                "revision": health.revision,
                "db_size": health.db_size,
                "leader": health.leader,
                "checked_at": health.checked_at.map(to_unix),
                "version": version.map(|v| v.to_string()),
                "upgrade": self.upgrade,
                "known_issues": known_issues,
            },
            "ownership": self.ownership_json(),
            "backup": self.backup_json(),
            "copies": self.copies_json(),
            "standby": serde_json::to_value(&*self.standby.borrow()).unwrap_or_default(),
            "space": self.space_json(&health),
            "member": {
                "holding_back": self.member.borrow().clone(),
                "leave_refused": self.leave_refused.borrow().clone(),
            },
            "restore": {
                "in_progress": self.restoring.borrow().is_some(),
                "step": self.restoring.borrow().clone(),
                "startup_restores": serde_json::to_value(&*self.restores.borrow()).unwrap_or_default(),
            },
            "warden": {
                "pid": std::process::id(),
                "role": match self.role { InitRole::Pid1 => "pid1", InitRole::Subreaper => "subreaper" },
                "orphans_reaped": self.reaper.orphans_reaped(),
                "started_at": to_unix(self.started_at),
                "version": env!("CARGO_PKG_VERSION"),
            },
        })
    }
}
