//! The process layer: the warden as PID 1 or a child subreaper (`pid1`, the one owner of
//! `waitpid(-1)`), OS signals as typed events (`signals`), and the etcd child itself
//! (`supervisor`: a pure state machine, its actor and the launch). It knows nothing of backups.

pub mod pid1;
pub mod signals;
pub mod supervisor;
