//! Everything about the etcd being run: its command line (`args`), the warden's client to it
//! (`client`) and the health loop (`health`).

pub mod args;
pub mod client;
pub mod health;

pub use args::EtcdArgs;
pub use client::{ClientConfig, TlsOverrides};
pub use health::Health;
