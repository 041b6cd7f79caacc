//! The etcd child: a pure state machine (`machine`) driven by one actor (`actor`) that owns the
//! process, and the launch recipe (`launch`).

mod actor;
mod launch;
mod machine;

pub use actor::{ChildState, Request, Supervisor};
pub use launch::{Launch, is_private_env, limit_data, pass_file};
pub use machine::{Phase, Policy};
