//! What Kubernetes puts in etcd that a backup depends on: the keys of Secrets encrypted at rest
//! ([`encryption`], read from a full's own bytes by [`needs`]); and the objects behind its keys, as `diff` and `undo` name them ([`object`]).

pub mod encryption;
pub mod needs;
pub mod object;
