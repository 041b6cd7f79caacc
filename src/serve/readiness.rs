//! Rule 1: readiness is about etcd, never about backups.
//!
//! `/readyz` is 200 exactly when nothing holds etcd back (a shutdown, a fence, ownership not
//! confirmed, a restore: the `gate`) and the etcd process of the current incarnation is running and
//! has answered a linearizable read with a leader and no NOSPACE/CORRUPT alarm. Backup state is
//! deliberately not an input here.

use crate::etcd::Health;
use crate::etcd::supervisor::{ChildState, Phase};

/// `Ok` when ready, otherwise the reason shown by `/readyz`.
pub fn evaluate(child: &ChildState, health: &Health, gate: Option<String>) -> Result<(), String> {
    if let Some(reason) = gate {
        return Err(reason);
    }
    match child.phase {
        Phase::Running if child.pid.is_some() => {}
        Phase::Idle => return Err("etcd has not been started yet".to_owned()),
        Phase::Running => return Err("etcd is starting".to_owned()),
        Phase::Backoff if child.held_back.is_some() => {
            return Err(child.held_back.clone().unwrap_or_default());
        }
        Phase::Backoff => {
            let last = child.last_exit.map(|s| format!(" ({s})")).unwrap_or_default();
            return Err(format!("etcd exited{last} and is waiting to be restarted"));
        }
        Phase::Delayed => {
            let last = child.last_exit.map(|s| format!(" ({s})")).unwrap_or_default();
            return Err(format!(
                "etcd exited{last} at its last start and starts again after its backoff"
            ));
        }
        Phase::Stopping => return Err("etcd is being stopped".to_owned()),
        Phase::Stopped => return Err("etcd is stopped".to_owned()),
        Phase::Fencing | Phase::Fenced => return Err("fenced: etcd was killed".to_owned()),
    }
    if health.incarnation != child.incarnation {
        return Err("etcd has not passed a health check since it started".to_owned());
    }
    match (&health.healthy, &health.reason) {
        (true, _) => Ok(()),
        (false, Some(reason)) => Err(reason.clone()),
        (false, None) => Err("etcd is not healthy".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::pid1::ExitStatus;

    fn running(incarnation: u64) -> ChildState {
        ChildState {
            phase: Phase::Running,
            pid: Some(42),
            incarnation,
            ..ChildState::initial()
        }
    }

    fn healthy(incarnation: u64) -> Health {
        Health {
            incarnation,
            healthy: true,
            ..Health::default()
        }
    }

    #[test]
    fn table() {
        let backoff = ChildState {
            phase: Phase::Backoff,
            last_exit: Some(ExitStatus::Signal(9)),
            incarnation: 1,
            ..ChildState::initial()
        };
        let sick = Health {
            incarnation: 1,
            healthy: false,
            reason: Some("etcd has no leader".into()),
            ..Health::default()
        };
        let cases: Vec<(ChildState, Health, Result<(), &str>)> = vec![
            (running(1), healthy(1), Ok(())),
            (
                ChildState::initial(),
                Health::default(),
                Err("etcd has not been started yet"),
            ),
            (
                running(2),
                healthy(1),
                Err("etcd has not passed a health check since it started"),
            ),
            (
                backoff.clone(),
                healthy(1),
                Err("etcd exited (signal SIGKILL) and is waiting to be restarted"),
            ),
            (running(1), sick, Err("etcd has no leader")),
            (
                ChildState {
                    phase: Phase::Stopping,
                    ..running(1)
                },
                healthy(1),
                Err("etcd is being stopped"),
            ),
        ];
        for (child, health, want) in cases {
            assert_eq!(
                evaluate(&child, &health, None),
                want.map_err(str::to_owned),
                "{child:?} {health:?}"
            );
        }
        assert_eq!(
            evaluate(&running(1), &healthy(1), Some("not owner: x".into())),
            Err("not owner: x".to_owned()),
            "a gate wins over a healthy etcd"
        );
    }
}
