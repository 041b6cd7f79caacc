//! etcd-warden runs etcd for its operator: PID 1 (or subreaper) supervision, readiness, and — in the
//! parts that follow — backups, restore and ownership fencing. See `run` for the task diagram and
//! DESIGN.md (beside the project) for the contract.

pub mod backup;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod copies;
pub mod ctl;
pub mod envvars;
pub mod etcd;
pub mod failpoint;
pub mod format;
pub mod kube;
pub mod ownership;
pub mod probe;
pub mod process;
pub mod restore;
pub mod run;
pub mod serve;
pub mod snapshot;
pub mod space;
pub mod standby;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod undo;
pub mod upgrade;
