//! Where backups live: the `--store` URL (`url`). The object_store wrapper, key layout and retention
//! arrive with the backup engine.

pub mod url;

pub use url::{StoreUrl, StoreUrlError};
