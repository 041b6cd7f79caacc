//! What a full snapshot carries and a delta does not: cluster membership and auth (users, roles,
//! their permissions, whether auth is enabled). Deltas are key events only, so a change out there
//! would be lost in a restore of the newest chain until the next scheduled full. The backup loop
//! compares this fingerprint with the one recorded in the newest full snapshot's header and takes
//! a full snapshot soon after a change.
//!
//! Users' password hashes are not readable through the API: etcd's auth revision (`AuthStatus`,
//! 3.5+), which moves on every auth change including a password change and `auth disable`, stands
//! for them. On 3.4, which has no `AuthStatus`, a password change is carried by the next scheduled
//! full only.

use etcd_client::Client;

use crate::etcd::ClientConfig;
use crate::etcd::client::{is_auth_error, is_auth_message};
use sha2::{Digest, Sha256};

/// Why no fingerprint could be taken.
#[derive(Debug)]
pub enum OutsideError {
    /// Auth is on and this client has no credentials for it: reconnect (with `--etcd-user`).
    NeedsCredentials(String),
    /// etcd did not answer; try again later.
    Unavailable(String),
}

/// A digest of the membership and auth state (hex sha256), as seen by `client` (connected by
/// `config`), which `authenticated` says connected with credentials; `token` keeps that user's
/// token for etcd's auth status between calls.
pub async fn fingerprint(
    client: &mut Client,
    config: &ClientConfig,
    authenticated: bool,
    token: &mut Option<String>,
) -> Result<String, OutsideError> {
    let fail = |e: etcd_client::Error| {
        if is_auth_error(&e) {
            OutsideError::NeedsCredentials(e.to_string())
        } else {
            OutsideError::Unavailable(e.to_string())
        }
    };
    let mut lines = Vec::new();
    let members = client.member_list().await.map_err(fail)?;
    let mut members: Vec<String> = members
        .members()
        .iter()
        .map(|m| {
            format!(
                "member {:x} {} peers={} learner={}",
                m.id(),
                m.name(),
                m.peer_urls().join(","),
                m.is_learner()
            )
        })
        .collect();
    members.sort();
    lines.extend(members);
    lines.push(auth_line(client, config, authenticated, token).await?);
    let mut users: Vec<String> = client.user_list().await.map_err(fail)?.users().to_vec();
    users.sort();
    for u in users {
        let mut roles = client.user_get(u.as_str()).await.map_err(fail)?.roles().to_vec();
        roles.sort();
        lines.push(format!("user {u} roles={}", roles.join(",")));
    }
    let mut roles: Vec<String> = client.role_list().await.map_err(fail)?.roles().to_vec();
    roles.sort();
    for r in roles {
        let mut perms: Vec<String> = client
            .role_get(r.as_str())
            .await
            .map_err(fail)?
            .permissions()
            .iter()
            .map(|p| {
                format!(
                    "{:?} {} {}",
                    p.get_type(),
                    hex::encode(p.key()),
                    hex::encode(p.range_end())
                )
            })
            .collect();
        perms.sort();
        lines.push(format!("role {r} perms={}", perms.join(";")));
    }
    Ok(hex::encode(Sha256::digest(lines.join("\n").as_bytes())))
}

/// etcd's auth flag and revision as one line; without `AuthStatus` (3.4), whether this client
/// needed credentials.
async fn auth_line(
    client: &Client,
    config: &ClientConfig,
    authenticated: bool,
    token: &mut Option<String>,
) -> Result<String, OutsideError> {
    if !authenticated {
        *token = None;
    } else if token.is_none() {
        *token = config.token(client).await.map_err(|e| {
            let text = crate::telemetry::error_chain(&e);
            if is_auth_message(&text) {
                OutsideError::NeedsCredentials(text)
            } else {
                OutsideError::Unavailable(text)
            }
        })?;
    }
    match config.auth_status(token.as_deref()).await {
        Ok(Some(s)) => Ok(format!("auth enabled={} revision={}", s.enabled, s.revision)),
        Ok(None) => Ok(format!("auth enabled={authenticated}")),
        Err(e) => {
            let text = e.to_string();
            if !is_auth_message(&text) {
                Err(OutsideError::Unavailable(text))
            } else if token.take().is_some() {
                // An expired token: a new one next time.
                Err(OutsideError::Unavailable(text))
            } else {
                Err(OutsideError::NeedsCredentials(text))
            }
        }
    }
}
