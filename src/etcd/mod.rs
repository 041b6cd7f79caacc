//! Everything about the etcd being run: its command line (`args`), the warden's client to it
//! (`client`), the health loop (`health`), which release it is (`version`) and the throwaway etcd
//! on loopback that restores, checks and fencing use (`private`), and the etcd child itself
//! (`supervisor`: a pure state machine, its actor and the launch). It may call `process` (reaping)
//! and the floor, nothing above.

pub mod args;
pub mod client;
pub mod dirs;
pub mod flags;
pub mod health;
pub mod local;
pub mod ports;
pub mod private;
pub mod private_tls;
pub mod supervisor;
pub mod version;

pub use args::EtcdArgs;
pub use client::{ClientConfig, TlsOverrides};
pub use dirs::MemberDirs;
pub use health::Health;
