//! The process layer: the warden as PID 1 or a child subreaper (`pid1`, the one owner of
//! `waitpid(-1)`) and OS signals as typed events (`signals`). It knows nothing of etcd or backups;
//! the etcd child's supervisor lives with the rest of etcd (`crate::etcd::supervisor`).

pub mod pid1;
pub mod signals;
