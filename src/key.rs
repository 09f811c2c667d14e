//! Cache key derivation and the hash tag.
//!
//! A key is a 128-bit BLAKE3 digest of length-prefixed parts, so no two
//! different part lists can produce the same input to the hash, and no request
//! text ever reaches a Redis key name: the hash tag `{H}` is hex of the digest,
//! which no request can steer to a chosen slot or use to break out of braces.

use std::cell::RefCell;
use std::fmt;

/// The identity of one cache entry: a 128-bit digest.
///
/// Build one from your own parts with [`CacheKey::from_parts`] or from a single
/// string with [`CacheKey::new`]; the HTTP layer derives it from the method,
/// authority, path, query and (optionally) configured request headers.
///
/// ```
/// use herdguard::CacheKey;
/// let a = CacheKey::from_parts(&[b"user", b"42"]);
/// let b = CacheKey::from_parts(&[b"user4", b"2"]);
/// assert_ne!(a, b, "parts are length-prefixed, so they cannot run together");
/// assert_eq!(a.to_hex().len(), 32);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CacheKey([u8; 16]);

/// One 16-byte write, without the length prefix a derived `Hash` of an
/// array adds: every L1 lookup hashes a key (with the map's own keyed
/// SipHash), and the length is always 16.
impl std::hash::Hash for CacheKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u128(u128::from_le_bytes(self.0));
    }
}

impl CacheKey {
    /// The key of a single opaque string or byte string.
    pub fn new(key: impl AsRef<[u8]>) -> Self {
        Self::from_parts(&[key.as_ref()])
    }

    /// The key of an ordered list of parts.
    pub fn from_parts(parts: &[&[u8]]) -> Self {
        let mut h = KeyHasher::new();
        for p in parts {
            h.part(p);
        }
        h.finish()
    }

    /// A key from a digest read back from storage.
    pub(crate) const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Lowercase hex of the digest; this is the `{H}` hash tag in Redis.
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(32);
        self.push_hex(&mut s);
        s
    }

    /// Append the 32 lowercase hex digits of [`Self::to_hex`] to `out`.
    pub(crate) fn push_hex(&self, out: &mut String) {
        for b in self.0 {
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 0xf) as usize] as char);
        }
    }

    /// Parse the 32-digit lowercase hex form back into a key.
    pub(crate) fn from_hex(hex: &[u8]) -> Option<Self> {
        if hex.len() != 32 {
            return None;
        }
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut out = [0u8; 16];
        for (i, pair) in hex.chunks_exact(2).enumerate() {
            out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
        }
        Some(CacheKey(out))
    }

    /// The first 8 hex digits, for logs and spans.
    pub fn short(&self) -> String {
        let mut s = self.to_hex();
        s.truncate(8);
        s
    }
}

/// [`CacheKey::short`] as a `Display` that builds no string: for span
/// fields, which are formatted only when a subscriber records them.
pub(crate) struct ShortKey([u8; 4]);

impl CacheKey {
    pub(crate) fn short_display(&self) -> ShortKey {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.0[..4]);
        ShortKey(b)
    }
}

impl fmt::Display for ShortKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = [0u8; 8];
        for (i, b) in self.0.iter().enumerate() {
            out[2 * i] = HEX[(b >> 4) as usize];
            out[2 * i + 1] = HEX[(b & 0xf) as usize];
        }
        // Hex digits only: always UTF-8.
        f.write_str(std::str::from_utf8(&out).unwrap_or(""))
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CacheKey({})", self.to_hex())
    }
}

impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Incremental, allocation-free key builder. Every part is length-prefixed.
///
/// The parts are gathered on the stack and hashed by one `blake3::hash`
/// call at the end: for the few dozen bytes of a request's key that is one
/// or two compressions, where an update per part cost more than the hash
/// itself. Material past the buffer spills into an incremental hasher;
/// either way the digest is BLAKE3 of the same byte stream. Material that
/// fits the buffer is looked up in a small per-thread memo first (see
/// [`MEMO`]): the same bytes give the same key without hashing again.
#[derive(Debug, Clone)]
pub(crate) struct KeyHasher {
    buf: [u8; KEY_BUF],
    len: usize,
    spill: Option<blake3::Hasher>,
}

/// Bytes of key material hashed in one call (a URL key is usually < 128).
const KEY_BUF: usize = 256;

impl KeyHasher {
    pub(crate) fn new() -> Self {
        Self {
            buf: [0; KEY_BUF],
            len: 0,
            spill: None,
        }
    }

    /// Room for `n` more bytes in the buffer, spilling what it holds first
    /// when they would not fit.
    fn room(&mut self, n: usize) -> bool {
        if self.len + n <= KEY_BUF {
            return true;
        }
        let h = self.spill.get_or_insert_with(blake3::Hasher::new);
        h.update(&self.buf[..self.len]);
        self.len = 0;
        n <= KEY_BUF
    }

    /// Inlined: a key is a handful of short writes, and a call each cost
    /// more than the copy (the 8-byte length prefixes become one store).
    #[inline(always)]
    fn write(&mut self, bytes: &[u8]) {
        match self.buf.get_mut(self.len..self.len + bytes.len()) {
            Some(out) => {
                out.copy_from_slice(bytes);
                self.len += bytes.len();
            }
            None => self.write_spilling(bytes),
        }
    }

    /// [`Self::write`] past the buffer's end: spill it, then write.
    #[cold]
    #[inline(never)]
    fn write_spilling(&mut self, bytes: &[u8]) {
        if self.room(bytes.len()) {
            self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
            self.len += bytes.len();
        } else if let Some(h) = self.spill.as_mut() {
            h.update(bytes);
        }
    }

    #[inline]
    pub(crate) fn part(&mut self, bytes: &[u8]) -> &mut Self {
        self.write(&(bytes.len() as u64).to_le_bytes());
        self.write(bytes);
        self
    }

    #[inline]
    pub(crate) fn opt_part(&mut self, bytes: Option<&[u8]>) -> &mut Self {
        match bytes {
            Some(b) => {
                self.write(&[1]);
                self.part(b)
            }
            None => {
                self.write(&[0]);
                self
            }
        }
    }

    /// `opt_part` of the ASCII-lowercased bytes, without a copy on the heap.
    pub(crate) fn opt_part_lowercase(&mut self, bytes: Option<&[u8]>) -> &mut Self {
        let Some(bytes) = bytes else {
            return self.opt_part(None);
        };
        self.write(&[1]);
        self.write(&(bytes.len() as u64).to_le_bytes());
        for chunk in bytes.chunks(64) {
            // 64 <= KEY_BUF, so after `room` the chunk always fits.
            self.room(chunk.len());
            let out = &mut self.buf[self.len..self.len + chunk.len()];
            out.copy_from_slice(chunk);
            out.make_ascii_lowercase();
            self.len += chunk.len();
        }
        self
    }

    pub(crate) fn finish(&self) -> CacheKey {
        match &self.spill {
            None => remembered(&self.buf[..self.len]),
            Some(h) => {
                let mut h = h.clone();
                h.update(&self.buf[..self.len]);
                truncated(&h.finalize())
            }
        }
    }
}

/// BLAKE3 of `material`, truncated to a key.
fn digest(material: &[u8]) -> CacheKey {
    truncated(&blake3::hash(material))
}

/// A key is the first 128 bits of the digest.
fn truncated(hash: &blake3::Hash) -> CacheKey {
    let mut out = [0u8; 16];
    out.copy_from_slice(&hash.as_bytes()[..16]);
    CacheKey(out)
}

/// Key material this long or shorter is remembered per thread.
const MEMO_BYTES: usize = 128;
/// Keys remembered per thread (direct-mapped): about 10 KB.
const MEMO_SLOTS: usize = 64;

/// One remembered key: its material, byte for byte.
struct Remembered {
    len: usize,
    material: [u8; MEMO_BYTES],
    key: CacheKey,
}

impl Remembered {
    /// A slot no material matches (its length is past any slice's).
    fn empty() -> Self {
        Self {
            len: usize::MAX,
            material: [0; MEMO_BYTES],
            key: CacheKey([0; 16]),
        }
    }
}

thread_local! {
    /// The keys this thread derived last, by their material. Hot URLs
    /// repeat, and BLAKE3 over a URL's key is two compressions, about a
    /// tenth of an L1 hit: a hit whose material is here compares bytes
    /// instead. A key is returned only for exactly the same material, so
    /// nothing can make it answer another key; colliding slots only cost
    /// the hash that would have run anyway.
    static MEMO: RefCell<Vec<Remembered>> = const { RefCell::new(Vec::new()) };
}

/// [`digest`] through this thread's [`MEMO`].
fn remembered(material: &[u8]) -> CacheKey {
    if material.len() > MEMO_BYTES {
        return digest(material);
    }
    let slot = slot_of(material);
    MEMO.try_with(|memo| {
        let mut memo = memo.borrow_mut();
        if memo.is_empty() {
            memo.resize_with(MEMO_SLOTS, Remembered::empty);
        }
        let r = &mut memo[slot];
        if r.material.get(..r.len) == Some(material) {
            return r.key;
        }
        // Overwritten in place: no copy of the slot on the stack.
        r.key = digest(material);
        r.material[..material.len()].copy_from_slice(material);
        r.len = material.len();
        r.key
    })
    // The thread is exiting: no memo, just the hash.
    .unwrap_or_else(|_| digest(material))
}

/// A slot for `material`: FxHash-style mixing of its words. Not keyed and
/// not meant to be: a chosen collision evicts a slot, it never matches.
fn slot_of(material: &[u8]) -> usize {
    let mut h = material.len() as u64;
    let mut words = material.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    for &b in words.remainder() {
        h = (h.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    (h >> 58) as usize % MEMO_SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Absence and emptiness of an optional part give different keys.
    #[test]
    fn absent_part_differs_from_empty_part() {
        let mut a = KeyHasher::new();
        a.opt_part(None);
        let mut b = KeyHasher::new();
        b.opt_part(Some(b""));
        assert_ne!(a.finish(), b.finish());
    }

    /// The lowercasing part hashes exactly like a lowercase plain part.
    #[test]
    fn lowercase_part_matches_lowercase_input() {
        let long = "Ex".repeat(100);
        let mut a = KeyHasher::new();
        a.opt_part_lowercase(Some(long.as_bytes()));
        let mut b = KeyHasher::new();
        b.opt_part(Some(long.to_lowercase().as_bytes()));
        assert_eq!(a.finish(), b.finish());
    }

    /// The digest is BLAKE3 of the length-prefixed parts whatever their
    /// size: below the stack buffer, across its end and past it, so keys
    /// stored by earlier versions (one update per part) still match.
    #[test]
    fn buffered_parts_hash_as_one_stream() {
        for sizes in [
            &[3, 9][..],
            &[200, 60],
            &[250, 1],
            &[1000, 7, 300],
            &[256],
            &[0, 255],
        ] {
            let parts: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| (0..n).map(|j| (i * 31 + j) as u8).collect())
                .collect();
            let mut reference = blake3::Hasher::new();
            let mut h = KeyHasher::new();
            for p in &parts {
                reference.update(&(p.len() as u64).to_le_bytes());
                reference.update(p);
                h.part(p);
            }
            let long = "Ab".repeat(150);
            reference.update(&[1]);
            reference.update(&(long.len() as u64).to_le_bytes());
            reference.update(long.to_lowercase().as_bytes());
            h.opt_part_lowercase(Some(long.as_bytes()));
            reference.update(&[0]);
            h.opt_part(None);
            let digest = reference.finalize();
            assert_eq!(
                h.finish().as_bytes()[..],
                digest.as_bytes()[..16],
                "sizes {sizes:?}"
            );
        }
    }

    /// Materials that share a memo slot each get their own BLAKE3 key, remembered or not.
    #[test]
    fn memo_answers_only_the_same_material() {
        // Of one length, so only their bytes tell them apart.
        let a = b"m-00000000".to_vec();
        let b = (1u32..)
            .map(|i| format!("m-{i:08}").into_bytes())
            .find(|m| slot_of(m) == slot_of(&a))
            .unwrap();
        for m in [&a, &b, &a, &a, &b, &b] {
            assert_eq!(remembered(m), digest(m), "{:?}", String::from_utf8_lossy(m));
        }
        let long = vec![b'x'; MEMO_BYTES + 1];
        assert_eq!(remembered(&long), digest(&long));
    }

    /// The span's short form is the first 8 hex digits, as `short()`.
    #[test]
    fn short_display_is_short() {
        let k = CacheKey::new("y");
        assert_eq!(k.short_display().to_string(), k.short());
        assert_eq!(k.short().len(), 8);
    }

    /// Hex round-trips, and malformed hex is refused.
    #[test]
    fn hex_round_trips() {
        let k = CacheKey::new("x");
        assert_eq!(CacheKey::from_hex(k.to_hex().as_bytes()), Some(k));
        assert_eq!(CacheKey::from_hex(b"zz"), None);
        assert_eq!(CacheKey::from_hex(&[b'g'; 32]), None);
    }

    /// The hex form only ever contains [0-9a-f], so it is safe inside a hash tag.
    #[test]
    fn hex_is_brace_free() {
        let k = CacheKey::new("}{ evil {tag} \u{0}\u{ff}");
        assert!(k.to_hex().bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
