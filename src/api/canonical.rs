//! Canonical JSON bytes, the form every hash in ctxsim is taken over.
//!
//! The definition (stable; changing it changes every fingerprint):
//! - compact JSON (no whitespace), UTF-8, as `serde_json` writes it;
//! - the fields ctxsim models in their declaration order (the order the reference client
//!   writes them), then unmodelled fields in the order they arrived;
//! - nested free-form values (`tool_use.input`, `input_schema`, `source`, ...) keep their key
//!   order: the provider hashes what it is sent, and a client that reorders the keys of a
//!   tool input breaks its cache, so the order must stay visible to the simulator;
//! - for a *prompt block* (a tool definition, a system block, a message content block) the
//!   block's own `cache_control` is left out, because the provider's prefix key does not depend
//!   on where the markers sit (the real client moves its message marker every request and
//!   still reads the previous prefix);
//! - a message whose `content` is a string is the same as one text block with that text (the
//!   real client flips the last user message between the two forms).
//!
//! Whole request bodies (`body_sha256`, run fingerprints) are hashed over the same structure
//! with every marker in place (a marker moving *is* a change of the body) and `messages` moved
//! after the other fields, so that a body is hashed for the price of its new messages
//! ([`super::structural::body_sha256`]).
//!
//! Hashing does not produce this text: [`super::structural`] feeds the serde data model of a
//! value straight into the hasher, which gives equal hashes exactly for equal canonical bytes
//! without paying for JSON string escaping.

use serde::Serialize;

/// Canonical bytes of any serializable value.
pub fn to_canonical_bytes<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("wire types always serialize to JSON")
}

/// Appends the canonical bytes of `value` to `out` (reusing one buffer across blocks).
pub fn write_canonical<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) {
    serde_json::to_writer(out, value).expect("wire types always serialize to JSON");
}

/// 128-bit content hash (xxh3) used for block identity, memoization and cache keys.
pub fn hash128(bytes: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(bytes)
}

/// Chains a prefix hash with the next element's hash.
pub fn chain(previous: u128, next: u128) -> u128 {
    let mut buf = [0u8; 32];
    buf[..16].copy_from_slice(&previous.to_le_bytes());
    buf[16..].copy_from_slice(&next.to_le_bytes());
    hash128(&buf)
}

/// Lower-case hex SHA-256 of bytes (for `body_sha256` and fingerprints users compare with
/// external tools).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex(&sha2::Sha256::digest(bytes))
}

/// Lower-case hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 15)]));
    }
    out
}

/// Short hex of a 128-bit hash, for readable renderings.
pub fn short_hex(hash: u128) -> String {
    format!("{:08x}", (hash >> 96) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ContentBlock;
    use serde_json::json;

    #[test]
    fn key_order_of_nested_values_is_kept() {
        let a = ContentBlock::tool_use("t1", "Edit", json!({"b": 1, "a": 2}));
        let b = ContentBlock::tool_use("t1", "Edit", json!({"a": 2, "b": 1}));
        assert_ne!(to_canonical_bytes(&a), to_canonical_bytes(&b));
        assert_eq!(String::from_utf8(to_canonical_bytes(&a)).unwrap(), r#"{"type":"tool_use","id":"t1","name":"Edit","input":{"b":1,"a":2}}"#);
    }
}
