//! Header values of small numbers (`Age`, `Content-Length`) over static
//! bytes.
//!
//! A `HeaderValue` made by `HeaderValue::from(n)` owns a heap buffer, and
//! once cloned (a stored head is cloned into every hit's answer) each copy
//! and each drop counts a shared reference with an atomic instruction. The
//! text of every number below [`STATIC_BELOW`] is laid out once, at compile
//! time, in one static table; a value cut from it is cloned and dropped for
//! free, with no allocation and no reference count.

use bytes::Bytes;
use http::header::HeaderValue;

/// Numbers below this have their text in [`DIGITS`].
pub(crate) const STATIC_BELOW: u64 = 10_000;

/// Bytes of "0", "1", …, "9999" laid end to end: 10 numbers of 1 digit,
/// 90 of 2, 900 of 3, 9,000 of 4.
const LEN: usize = 10 + 90 * 2 + 900 * 3 + 9_000 * 4;

/// For each digit count (index 1 to 4): its first number and where that
/// number's text starts in [`DIGITS`].
const SPANS: [(usize, usize); 5] = [(0, 0), (0, 0), (10, 10), (100, 190), (1_000, 2_890)];

static DIGITS: [u8; LEN] = digits();

const fn digits() -> [u8; LEN] {
    let mut out = [0u8; LEN];
    let mut at = 0;
    let mut n = 0;
    while n < STATIC_BELOW as usize {
        let width = width(n as u64);
        let mut rest = n;
        let mut i = width;
        while i > 0 {
            i -= 1;
            out[at + i] = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        at += width;
        n += 1;
    }
    out
}

/// Digits in `n` (below [`STATIC_BELOW`]).
const fn width(n: u64) -> usize {
    match n {
        0..=9 => 1,
        10..=99 => 2,
        100..=999 => 3,
        _ => 4,
    }
}

/// `n` in decimal as a header value: static bytes below [`STATIC_BELOW`],
/// a buffer of its own above.
pub(crate) fn number_value(n: u64) -> HeaderValue {
    if n >= STATIC_BELOW {
        return HeaderValue::from(n);
    }
    let w = width(n);
    let (first, start) = SPANS[w];
    let at = start + (n as usize - first) * w;
    match DIGITS.get(at..at + w) {
        Some(text) => HeaderValue::from_maybe_shared(Bytes::from_static(text))
            .unwrap_or_else(|_| HeaderValue::from(n)),
        None => HeaderValue::from(n),
    }
}

/// Whether `v`'s bytes are the static table's (for tests of the heads that
/// use it).
#[cfg(test)]
pub(crate) fn is_static(v: &HeaderValue) -> bool {
    DIGITS.as_ptr_range().contains(&v.as_bytes().as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every number reads as itself, on both sides of the table's end.
    #[test]
    fn numbers_read_as_themselves() {
        for n in (0..STATIC_BELOW + 20).chain([u64::from(u32::MAX), u64::MAX]) {
            assert_eq!(number_value(n), n.to_string().as_str(), "{n}");
        }
    }

    /// Below the bound the value's bytes are the static table's: nothing
    /// allocated, nothing counted when a hit clones it.
    #[test]
    fn small_numbers_are_static() {
        for n in [0, 7, 10, 99, 512, 3_600, STATIC_BELOW - 1] {
            assert!(is_static(&number_value(n)), "{n} was copied");
        }
        assert!(!is_static(&number_value(STATIC_BELOW)));
    }
}
