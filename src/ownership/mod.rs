//! Rule 2: who owns the data. A TXT record at `--owner-name` names the owner; this host is the owner
//! when the record's value equals `--owner-id`.
//!
//! The checker publishes [`OwnershipStatus`]; its `may_serve` bit is the decision the run loop acts
//! on, made by the pure [`Tracker`]: an answer naming this host grants it, an answer naming someone
//! else revokes it, and anything else (timeout, SERVFAIL, no record, disagreeing records) changes
//! nothing: a flaky DNS server must never kill a healthy owner, nor start etcd on a host that was
//! never confirmed. What happens when the bit falls lives in [`fence`].

pub mod check;
pub mod fence;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

pub use check::{Lookup, Verdict};

/// `--owner-name`, `--owner-id`, `--owner-check-interval`, `--owner-check-resolver`, `--owner-check-timeout`.
#[derive(Debug, Clone)]
pub struct OwnershipConfig {
    pub id: String,
    pub interval: Duration,
    pub lookup: Lookup,
}

/// A change of the decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Gained,
    Lost,
}

/// The decision, from verdicts alone.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tracker {
    pub may_serve: bool,
    pub confirmed_once: bool,
}

impl Tracker {
    pub fn observe(&mut self, verdict: &Verdict) -> Option<Transition> {
        match verdict {
            Verdict::Owner => {
                self.confirmed_once = true;
                (!std::mem::replace(&mut self.may_serve, true)).then_some(Transition::Gained)
            }
            Verdict::Other(_) => std::mem::replace(&mut self.may_serve, false).then_some(Transition::Lost),
            Verdict::Unknown(_) => None,
        }
    }
}

/// `/status` → `ownership`, metrics, readiness.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OwnershipStatus {
    pub configured: bool,
    /// The last check's answer: `owner`, `not-owner`, `unknown` (or `not_configured`).
    pub state: &'static str,
    /// The owner the record named at the last answer that named anyone.
    pub owner_seen: Option<String>,
    /// Why the last check was `unknown`.
    pub detail: Option<String>,
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub checked_at: Option<SystemTime>,
    /// The decision: etcd may serve clients from this host.
    pub may_serve: bool,
    pub confirmed_once: bool,
    pub checks_owner_total: u64,
    pub checks_not_owner_total: u64,
    pub checks_unknown_total: u64,
    pub last_check_seconds: f64,
}

impl OwnershipStatus {
    pub fn not_configured() -> Self {
        Self {
            state: "not_configured",
            may_serve: true,
            ..Self::default()
        }
    }

    pub fn unchecked() -> Self {
        Self {
            configured: true,
            state: "unknown",
            detail: Some("not checked yet".into()),
            ..Self::default()
        }
    }

    /// Why readiness is 503 because of ownership, if it is.
    pub fn not_ready_reason(&self) -> Option<String> {
        if self.may_serve {
            return None;
        }
        Some(match (&self.owner_seen, self.state) {
            (Some(other), "not-owner") => format!("not owner: the owner record names {other:?}"),
            _ => format!(
                "not owner: ownership not confirmed yet ({})",
                self.detail.as_deref().unwrap_or(self.state)
            ),
        })
    }
}

/// Checks every interval and whenever `recheck` is notified (SIGHUP), until cancelled.
pub async fn run(
    cfg: OwnershipConfig,
    status: watch::Sender<OwnershipStatus>,
    recheck: Arc<Notify>,
    cancel: CancellationToken,
) {
    let mut tracker = Tracker::default();
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
            _ = recheck.notified() => tick.reset(),
        }
        let started = std::time::Instant::now();
        let verdict = cfg.lookup.check(&cfg.id).await;
        let took = started.elapsed().as_secs_f64();
        let transition = tracker.observe(&verdict);
        let previous = status.borrow().state;
        status.send_modify(|s| {
            s.checked_at = Some(SystemTime::now());
            s.last_check_seconds = took;
            s.may_serve = tracker.may_serve;
            s.confirmed_once = tracker.confirmed_once;
            match &verdict {
                Verdict::Owner => {
                    s.state = "owner";
                    s.owner_seen = Some(cfg.id.clone());
                    s.detail = None;
                    s.checks_owner_total += 1;
                }
                Verdict::Other(who) => {
                    s.state = "not-owner";
                    s.owner_seen = Some(who.clone());
                    s.detail = None;
                    s.checks_not_owner_total += 1;
                }
                Verdict::Unknown(why) => {
                    s.state = "unknown";
                    s.detail = Some(why.clone());
                    s.checks_unknown_total += 1;
                }
            }
        });
        match (transition, &verdict) {
            (Some(Transition::Lost), Verdict::Other(who)) => {
                tracing::error!(owner = %who, name = %cfg.lookup.name, "ownership lost: the owner record names another host")
            }
            (Some(Transition::Gained), _) => {
                tracing::info!(id = %cfg.id, name = %cfg.lookup.name, "ownership confirmed")
            }
            (None, Verdict::Unknown(why)) if previous != "unknown" => tracing::warn!(
                error = %why,
                may_serve = tracker.may_serve,
                "ownership check failed; the decision stands until an answer arrives"
            ),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_answer_naming_another_host_revokes() {
        let mut t = Tracker::default();
        let unknown = Verdict::Unknown("timeout".into());
        let other = Verdict::Other("host-b".into());
        assert_eq!(t.observe(&unknown), None, "unknown never grants");
        assert_eq!(t.observe(&other), None, "never confirmed: nothing to lose");
        assert!(!t.may_serve && !t.confirmed_once);
        assert_eq!(t.observe(&Verdict::Owner), Some(Transition::Gained));
        assert_eq!(t.observe(&Verdict::Owner), None);
        assert_eq!(t.observe(&unknown), None, "unknown never revokes");
        assert!(t.may_serve);
        assert_eq!(t.observe(&other), Some(Transition::Lost));
        assert_eq!(t.observe(&other), None);
        assert_eq!(t.observe(&unknown), None);
        assert!(!t.may_serve && t.confirmed_once);
        assert_eq!(t.observe(&Verdict::Owner), Some(Transition::Gained));
    }

    #[test]
    fn readiness_reasons() {
        assert_eq!(OwnershipStatus::not_configured().not_ready_reason(), None);
        let r = OwnershipStatus::unchecked().not_ready_reason().unwrap();
        assert!(r.starts_with("not owner: ownership not confirmed yet"), "{r}");
        let lost = OwnershipStatus {
            configured: true,
            state: "not-owner",
            owner_seen: Some("host-b".into()),
            ..OwnershipStatus::default()
        };
        assert_eq!(
            lost.not_ready_reason().unwrap(),
            "not owner: the owner record names \"host-b\""
        );
    }
}
