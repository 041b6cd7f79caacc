//! etcd-warden runs etcd for its operator: PID 1 (or subreaper) supervision, readiness, and — in the
//! parts that follow — backups, restore and ownership fencing. See `cmd::run` for the task diagram and
//! DESIGN.md (beside the project) for the contract.

pub mod backup;
pub mod cluster;
pub mod cmd;
pub mod copies;
pub mod etcd;
pub mod failpoint;
pub mod format;
pub mod kube;
pub mod ownership;
pub mod process;
pub mod restore;
pub mod serve;
pub mod snapshot;
pub mod space;
pub mod standby;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod undo;
pub mod upgrade;
