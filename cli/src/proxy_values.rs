//! Values in `herdguard proxy`'s options as people write them, on the
//! command line and in the config file: sizes (`64MiB`), durations (`5s`,
//! or bare seconds), and the access log's older boolean form.

use std::time::Duration;

use serde::Deserialize;

use crate::proxy::parse_duration;

/// `8MiB` for whole binary units, else bytes: what `parse_bytes` reads back.
pub(crate) fn show_bytes(n: u64) -> String {
    for (unit, size) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if n >= size && n.is_multiple_of(size) {
            return format!("{}{unit}", n / size);
        }
    }
    n.to_string()
}

/// A size as people write it: `64MiB`, `512 KiB`, `1.5GB` (MB is 10^6,
/// MiB 2^20; see `bytesize`), or bare bytes.
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    s.trim()
        .parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|e| format!("{s:?} is not a size (64MiB, 512KiB, 8388608): {e}"))
}

/// `access-log` in the config file: a string as on the command line, or the
/// older boolean (true: stderr, false: off).
pub(crate) fn de_access_log<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Value {
        Flag(bool),
        Text(String),
    }
    Ok(Option::<Value>::deserialize(d)?.map(|v| match v {
        Value::Flag(on) => on.to_string(),
        Value::Text(s) => s,
    }))
}

/// A number (seconds or bytes) or a string as on the command line.
#[derive(Deserialize)]
#[serde(untagged)]
enum NumberOrText {
    Number(u64),
    Text(String),
}

/// A duration in the config file: `"5s"`, or a number of seconds.
pub(crate) fn de_duration<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    Ok(match Option::<NumberOrText>::deserialize(d)? {
        None => None,
        Some(NumberOrText::Number(secs)) => Some(Duration::from_secs(secs)),
        Some(NumberOrText::Text(s)) => Some(parse_duration(&s).map_err(serde::de::Error::custom)?),
    })
}

/// A size in the config file: `"64MiB"`, or a number of bytes.
pub(crate) fn de_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(match Option::<NumberOrText>::deserialize(d)? {
        None => None,
        Some(NumberOrText::Number(n)) => Some(n),
        Some(NumberOrText::Text(s)) => Some(parse_bytes(&s).map_err(serde::de::Error::custom)?),
    })
}

/// A size option as the type the setting takes.
pub(crate) fn size<T: TryFrom<u64>>(option: &str, bytes: u64) -> Result<T, String> {
    T::try_from(bytes).map_err(|_| format!("--{option} {bytes} is too large for this platform"))
}
