//! One ownership check: a DNS TXT lookup, judged against this host's id.
//!
//! A fresh resolver per check: no answer is ever served from a cache, so a flipped record is seen at
//! the next tick (whatever caching the upstream resolver does is the operator's TTL to set). The
//! system resolver (`/etc/resolv.conf`, re-read each time) or `--owner-check-resolver HOST:PORT`.

use std::net::SocketAddr;
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::RData;

/// What one check says. Only [`Verdict::Other`] can take ownership away (rule 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The record names this host.
    Owner,
    /// The record names someone else (the value seen).
    Other(String),
    /// No usable answer: timeout, server failure, no record, or records that disagree.
    Unknown(String),
}

/// Judges the TXT values found at the owner name. One TXT record may be split into several
/// character-strings; they are joined, as RFC 7208 does for SPF. Several records that disagree are
/// "unknown": nobody can tell who owns the data, so nothing is started and nothing is killed.
pub fn judge(records: &[String], owner_id: &str) -> Verdict {
    let mut values: Vec<&str> = records.iter().map(|r| r.trim()).collect();
    values.sort_unstable();
    values.dedup();
    match values.as_slice() {
        [] => Verdict::Unknown("no TXT record at the owner name".into()),
        [one] if *one == owner_id => Verdict::Owner,
        [one] => Verdict::Other((*one).to_owned()),
        many => Verdict::Unknown(format!(
            "{} TXT records disagree: {}",
            many.len(),
            many.join(", ")
        )),
    }
}

/// Where and how to ask.
#[derive(Debug, Clone)]
pub struct Lookup {
    /// Fully qualified (a trailing dot is added): no search-domain guessing.
    pub name: String,
    pub resolver: Option<SocketAddr>,
    pub timeout: Duration,
}

impl Lookup {
    fn resolver(&self) -> Result<TokioResolver, String> {
        let mut builder = match self.resolver {
            Some(addr) => {
                let mut server = NameServerConfig::udp_and_tcp(addr.ip());
                server.connections = [ConnectionConfig::udp(), ConnectionConfig::tcp()]
                    .into_iter()
                    .map(|mut c| {
                        c.port = addr.port();
                        c
                    })
                    .collect();
                TokioResolver::builder_with_config(
                    ResolverConfig::from_name_servers(vec![server]),
                    TokioRuntimeProvider::default(),
                )
            }
            None => TokioResolver::builder_tokio()
                .map_err(|e| format!("read the system resolver configuration: {e}"))?,
        };
        let opts: &mut ResolverOpts = builder.options_mut();
        opts.timeout = self.timeout;
        opts.attempts = 1;
        opts.cache_size = 0;
        opts.positive_max_ttl = Some(Duration::ZERO);
        opts.negative_max_ttl = Some(Duration::ZERO);
        opts.ndots = 0;
        builder
            .build()
            .map_err(|e| format!("configure the resolver: {e}"))
    }

    /// The TXT values at the owner name (each record's strings joined).
    pub async fn txt(&self) -> Result<Vec<String>, String> {
        let resolver = self.resolver()?;
        let fqdn = if self.name.ends_with('.') {
            self.name.clone()
        } else {
            format!("{}.", self.name)
        };
        let lookup = tokio::time::timeout(
            self.timeout + Duration::from_millis(100),
            resolver.txt_lookup(fqdn),
        )
        .await
        .map_err(|_| format!("no answer within {}", humantime::format_duration(self.timeout)))?;
        match lookup {
            Ok(found) => Ok(found
                .answers()
                .iter()
                .filter_map(|r| match &r.data {
                    RData::TXT(txt) => Some(
                        txt.txt_data
                            .iter()
                            .map(|part| String::from_utf8_lossy(part).into_owned())
                            .collect::<String>(),
                    ),
                    _ => None,
                })
                .collect()),
            Err(e) if e.is_no_records_found() => Ok(Vec::new()),
            Err(e) => Err(e.to_string()),
        }
    }

    pub async fn check(&self, owner_id: &str) -> Verdict {
        match self.txt().await {
            Ok(records) => judge(&records, owner_id),
            Err(e) => Verdict::Unknown(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(values: &[&str]) -> Vec<String> {
        values.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn judge_table() {
        assert_eq!(judge(&v(&["host-a"]), "host-a"), Verdict::Owner);
        assert_eq!(judge(&v(&[" host-a\n"]), "host-a"), Verdict::Owner);
        assert_eq!(judge(&v(&["host-a", "host-a"]), "host-a"), Verdict::Owner);
        assert_eq!(judge(&v(&["host-b"]), "host-a"), Verdict::Other("host-b".into()));
        assert_eq!(judge(&v(&["Host-A"]), "host-a"), Verdict::Other("Host-A".into()));
        assert!(matches!(judge(&v(&[]), "host-a"), Verdict::Unknown(_)));
        let Verdict::Unknown(why) = judge(&v(&["host-a", "host-b"]), "host-a") else {
            panic!("disagreeing records must be unknown")
        };
        assert!(why.contains("disagree"), "{why}");
    }
}
