//! Everything about the etcd being run: its command line (`args`), the warden's client to it
//! (`client`), the health loop (`health`) and which release it is (`version`).

pub mod args;
pub mod client;
pub mod health;
pub mod version;

pub use args::EtcdArgs;
pub use client::{ClientConfig, TlsOverrides};
pub use health::Health;
