//! The entry's vocabulary: the `Value` trait, the stored envelope, the
//! lease and fence tokens.

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
