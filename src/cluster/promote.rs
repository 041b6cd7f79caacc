//! After a repair started this member's etcd as a learner: promote it once etcd accepts (the
//! learner has caught up with the leader). Until then readiness says "learner catching up". The
//! writer's warden promotes caught-up learners too ([`super::leadership::promote_caught_up_learners`]),
//! so whichever comes first wins and the other sees a voter.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::journal::Journal;
use super::peers::{self, ChangeError};
use crate::etcd::ClientConfig;

const EVERY: Duration = Duration::from_secs(1);

pub struct Learner {
    pub id: u64,
    pub client: ClientConfig,
    /// The other members' peer URLs and any `--cluster-endpoints`.
    pub peers: Vec<String>,
    pub endpoints: Vec<String>,
    pub ours: Vec<String>,
    pub data: PathBuf,
}

/// Promotes the learner; clears `gate` once it is a voter.
pub async fn run(l: Learner, gate: watch::Sender<Option<String>>) {
    let started = Instant::now();
    gate.send_replace(Some(format!("learner catching up (member {:x})", l.id)));
    loop {
        let survey = peers::survey(&l.client, &l.peers, &l.endpoints, &l.ours).await;
        if let Some((list, voter)) = survey.quorum {
            match list.iter().find(|m| m.id == l.id) {
                Some(m) if !m.is_learner => break,
                Some(_) => match peers::promote(&l.client, &voter, l.id).await {
                    Ok(()) => break,
                    Err(ChangeError::Other(e)) => tracing::debug!(error = %e, "learner not promoted yet"),
                    Err(e) => tracing::debug!(error = ?e, "learner not promoted yet"),
                },
                None => {
                    tracing::error!(
                        member = format!("{:x}", l.id),
                        "this learner is no longer a member (removed by someone else): leaving it to the operator"
                    );
                    gate.send_replace(Some(format!("member {:x} was removed from the cluster", l.id)));
                    return;
                }
            }
        }
        tokio::time::sleep(EVERY).await;
    }
    tracing::info!(
        member = format!("{:x}", l.id),
        seconds = started.elapsed().as_secs_f64(),
        "the learner is a voting member: repair done"
    );
    Journal::finish(&l.data);
    gate.send_replace(None);
}
