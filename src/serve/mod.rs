//! The surface operators and probes read: the state every task publishes (`state`), readiness as
//! a pure function of it (`readiness`, rule 1: never about backups), the HTTP endpoints on
//! `--listen` and the admin socket (`http`), Prometheus text (`metrics`) and systemd's notify
//! protocol (`notify`).

pub mod http;
pub mod metrics;
pub mod notify;
pub mod readiness;
pub mod state;
