//! What Kubernetes puts in etcd that a backup depends on: the keys of Secrets encrypted at rest
//! ([`encryption`]).

pub mod encryption;
