//! The entry's vocabulary, which the engine, the lock and the store all
//! speak: the [`Value`] trait (what a cache can hold), the envelope around
//! every stored entry (`envelope`: magic, version, timing, fence, checksum,
//! [`EntryMeta`](envelope::EntryMeta)), and the lease and fence tokens
//! (`token`). It sits below the store so that each of them takes these
//! from below instead of from one another.
//!
//! Must not import `inspect`, `http`, `engine`, `lock`, `store` or `hot`;
//! only `key`, `error` and `metrics` (see `.ci/layers.sh`).

pub(crate) mod envelope;
#[cfg(feature = "redis")]
mod token;
mod value;

#[cfg(feature = "redis")]
pub(crate) use token::{FenceToken, LeaseToken};
pub(crate) use value::sealed::Internal;
#[cfg(feature = "serde")]
pub use value::Json;
pub use value::Value;
pub(crate) use value::ValueMeta;
