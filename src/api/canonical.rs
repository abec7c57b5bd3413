//! Canonical JSON bytes, the form every hash in ctxsim is taken over.
//!
//! The definition (stable; changing it changes every fingerprint):
//! - compact JSON (no whitespace), UTF-8, strings escaped as `serde_json` escapes them;
//! - object keys sorted by their UTF-8 bytes, recursively;
//! - numbers as `serde_json` prints them (integers stay integers; no float appears in a key);
//! - for a *prompt block* (a tool definition, a system block, a message content block) the
//!   block's own top-level `cache_control` is removed before hashing, because the provider's
//!   prefix key does not depend on where the markers sit (the real client moves its message
//!   marker every request and still reads the previous prefix);
//! - a message whose `content` is a string is the same as one text block with that text (the
//!   real client flips the last user message between the two forms).
//!
//! Whole request bodies (`body_sha256`, request fingerprints) use the same rules without the
//! `cache_control` removal: a marker moving *is* a change of the body.

use serde::Serialize;
use serde_json::Value;
use std::io::Write;

/// Canonical bytes of any serializable value.
pub fn to_canonical_bytes<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let value = serde_json::to_value(value).expect("wire types always serialize to JSON");
    let mut out = Vec::with_capacity(256);
    write_canonical(&value, &mut out);
    out
}

/// Canonical bytes of a prompt block: its top-level `cache_control` is left out.
pub fn block_canonical_bytes<T: Serialize + ?Sized>(block: &T) -> Vec<u8> {
    let mut value = serde_json::to_value(block).expect("wire types always serialize to JSON");
    if let Value::Object(map) = &mut value {
        map.remove("cache_control");
    }
    let mut out = Vec::with_capacity(256);
    write_canonical(&value, &mut out);
    out
}

/// Writes `value` in canonical form.
pub fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_unstable();
            out.push(b'{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, key).expect("writing to a Vec cannot fail");
                out.push(b':');
                write_canonical(&map[key], out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => {
            out.write_all(serde_json::to_string(scalar).expect("scalars serialize").as_bytes())
                .expect("writing to a Vec cannot fail");
        }
    }
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
    let digest = sha2::Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for byte in digest.iter() {
        out.push_str(&format!("{byte:02x}"));
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
    use serde_json::json;

    #[test]
    fn keys_are_sorted_recursively() {
        let value = json!({"b": 1, "a": {"d": [1, {"z": 0, "y": 1}], "c": "x"}});
        let mut out = Vec::new();
        write_canonical(&value, &mut out);
        assert_eq!(String::from_utf8(out).unwrap(), r#"{"a":{"c":"x","d":[1,{"y":1,"z":0}]},"b":1}"#);
    }

    #[test]
    fn block_bytes_ignore_cache_control() {
        let with = json!({"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}});
        let without = json!({"text": "hi", "type": "text"});
        assert_eq!(block_canonical_bytes(&with), block_canonical_bytes(&without));
    }
}
