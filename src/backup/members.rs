//! The store's record of the cluster's members, kept current by the writer.

use etcd_client::Client;

use super::writer::Backup;
use crate::backup::leadership::LEADERSHIP_CHECK;
use crate::store::Store;

/// etcd's member list as the store's cluster record keeps it; `None` when etcd does not answer.
pub(crate) async fn members_of(client: &mut Client) -> Option<Vec<crate::store::owner::Member>> {
    let list = tokio::time::timeout(LEADERSHIP_CHECK, client.member_list())
        .await
        .ok()?
        .ok()?;
    Some(
        list.members()
            .iter()
            .map(|m| crate::store::owner::Member {
                name: m.name().to_owned(),
                id: m.id(),
                peer_urls: m.peer_urls().to_vec(),
                client_urls: m.client_urls().to_vec(),
                is_learner: m.is_learner(),
            })
            .collect(),
    )
}

impl Backup {
    /// The member list in the store's cluster record follows etcd's (joins, rejoins with a new
    /// id, leaves): what `cluster restore` reads to know the members. One etcd call per check, a
    /// store write only when the list changed.
    pub(super) async fn keep_members_current(&mut self, client: &mut Client, store: &Store) {
        let Some(members) = members_of(client).await else {
            return;
        };
        if self.recorded_members.as_ref() == Some(&members) {
            return;
        }
        let result = async {
            let Some(owner) = store.get_owner().await? else {
                return Ok(false);
            };
            if owner.cluster_id != self.identity.cluster_id {
                return Ok(false);
            }
            if owner.members != members {
                store
                    .put_owner(&crate::store::owner::Owner {
                        members: members.clone(),
                        updated_ms: crate::store::layout::now_ms(),
                        ..owner
                    })
                    .await?;
                tracing::info!(
                    members = ?members.iter().map(|m| format!("{} {:x}{}", m.name, m.id, if m.is_learner { " learner" } else { "" })).collect::<Vec<_>>(),
                    "membership changed: the store's member list updated"
                );
            }
            Ok::<bool, crate::store::StoreError>(true)
        }
        .await;
        match result {
            Ok(true) => self.recorded_members = Some(members),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::error_chain(&e), "cannot update the member list in the store; trying again")
            }
        }
    }
}
