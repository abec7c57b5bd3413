//! A structural hash of any serializable value: the serde data model fed straight into xxh3,
//! without producing JSON text.
//!
//! Two values hash alike exactly when they would serialize to the same JSON (same fields in the
//! same order, same scalars, same strings): every scalar is written with a type tag and every
//! string with its length, so no two different serializations share a byte stream. Skipping the
//! JSON writer (its string escaping and allocation) makes hashing a prompt block cost about as
//! much as reading its text once, which is what keeps measurement of long sessions cheap.
//!
//! A block's own `cache_control` and `cache_reference` (fields at depth 1) are left out, as in
//! [`super::canonical`]: both address the server's cache, neither is prompt content.

use serde::ser::{self, Serialize};

use super::Request;
use xxhash_rust::xxh3::Xxh3;

/// The structural hash of `value` and the number of content bytes it covered, leaving out the
/// top-level `cache_control` field.
pub fn block_hash<T: Serialize + ?Sized>(tag: &[u8], value: &T) -> (u128, u32) {
    let mut hasher = StructHasher { state: XxhSink::default(), depth: 0, bytes: 0, skip_next_value: false, skip_markers: true };
    hasher.state.update(tag);
    hasher.state.update(&[0xff]);
    value.serialize(&mut hasher).expect("hashing never fails");
    (hasher.state.digest128(), hasher.bytes.min(u64::from(u32::MAX)) as u32)
}

/// Lower-case hex SHA-256 of a whole value's structural encoding (every field, markers
/// included, in serialization order). Request bodies use [`body_sha256`], which puts
/// `messages` last.
pub fn sha256_hex<T: Serialize + ?Sized>(value: &T) -> String {
    let mut hasher = body_hasher(sha2::Sha256::default());
    value.serialize(&mut hasher).expect("hashing never fails");
    hasher.state.finish_hex()
}

/// The `body_sha256` of a request: SHA-256 of its structural stream with `messages` moved to
/// the end: `{`, `model`, the other fields present in declaration order, the unmodelled fields
/// in arrival order, then `messages`. Equal exactly when the JSON bodies are equal (field order
/// aside: the stream names every field, so moving one changes no equality). Messages go last
/// because they are what changes between the requests of a session; everything before them,
/// the system prompt and tools included, is hashed once per change ([`BodyHasher`]).
pub fn body_sha256(body: &Request) -> String {
    BodyHasher::default().sha256_hex(body, 0)
}

fn body_hasher(state: sha2::Sha256) -> StructHasher<Sha256Sink> {
    StructHasher { state: Sha256Sink { hasher: state, buf: Vec::with_capacity(8192) }, depth: 0, bytes: 0, skip_next_value: false, skip_markers: false }
}

/// [`body_sha256`] of request bodies, resumable at message boundaries.
///
/// The hasher keeps the last body's fields other than `messages` (its *head*) and its SHA-256
/// state before each of its messages. A body whose head is identical ([`super::identical`]) and
/// whose first `reuse` messages are identical to that body's is hashed from message `reuse` on:
/// the same digest as [`body_sha256`] of the whole body, for the bytes of the new messages.
#[derive(Clone, Debug, Default)]
pub struct BodyHasher {
    /// The last body without its messages.
    head: Option<Request>,
    /// The caller's key of that head ([`BodyHasher::sha256_hex_keyed`]).
    head_key: Option<u128>,
    /// The state before `messages[i]` (and, last, after the final message) of the last body.
    checkpoints: Vec<sha2::Sha256>,
}

/// The fields of a request other than `messages`, identical.
fn same_head(a: &Request, b: &Request) -> bool {
    use super::identical::Identical;
    let Request {
        model,
        messages: _,
        system,
        tools,
        tool_choice,
        metadata,
        max_tokens,
        thinking,
        temperature,
        context_management,
        output_config,
        cache_control,
        stream,
        extra,
    } = a;
    *model == b.model
        && system.identical(&b.system)
        && tools.identical(&b.tools)
        && tool_choice.identical(&b.tool_choice)
        && metadata.identical(&b.metadata)
        && *max_tokens == b.max_tokens
        && thinking.identical(&b.thinking)
        && temperature.identical(&b.temperature)
        && context_management.identical(&b.context_management)
        && output_config.identical(&b.output_config)
        && cache_control.identical(&b.cache_control)
        && *stream == b.stream
        && extra.identical(&b.extra)
}

impl BodyHasher {
    /// The body hash of `body`. `reuse`: how many leading messages of `body` are identical to
    /// those of the body this hasher hashed last (0 when in doubt); the head is compared here.
    pub fn sha256_hex(&mut self, body: &Request, reuse: usize) -> String {
        self.sha256_hex_keyed(body, reuse, None)
    }

    /// [`Self::sha256_hex`] given a key of the body's fields other than `messages`: equal keys
    /// mean identical heads, so the head is compared only when the keys differ.
    pub fn sha256_hex_keyed(&mut self, body: &Request, reuse: usize, head_key: Option<u128>) -> String {
        use ser::SerializeMap;
        let keyed_same = head_key.is_some() && head_key == self.head_key && self.head.is_some();
        let head_same = keyed_same || self.head.as_ref().is_some_and(|head| same_head(head, body));
        self.head_key = head_key;
        let Request {
            model,
            messages,
            system,
            tools,
            tool_choice,
            metadata,
            max_tokens,
            thinking,
            temperature,
            context_management,
            output_config,
            cache_control,
            stream,
            extra,
        } = body;
        let mut hasher;
        if head_same && !self.checkpoints.is_empty() {
            let reuse = reuse.min(messages.len()).min(self.checkpoints.len() - 1);
            self.checkpoints.truncate(reuse + 1);
            hasher = body_hasher(self.checkpoints[reuse].clone());
        } else {
            hasher = body_hasher(sha2::Sha256::default());
            let mut map = ser::Serializer::serialize_map(&mut hasher, None).expect("hashing never fails");
            map.serialize_entry("model", model).expect("hashing never fails");
            // The optional fields when present, then `extra`, as `#[derive(Serialize)]` writes them.
            let fields: [(&str, Option<&dyn erased::Value>); 11] = [
                ("system", system.as_ref().map(|v| v as _)),
                ("tools", tools.as_ref().map(|v| v as _)),
                ("tool_choice", tool_choice.as_ref().map(|v| v as _)),
                ("metadata", metadata.as_ref().map(|v| v as _)),
                ("max_tokens", max_tokens.as_ref().map(|v| v as _)),
                ("thinking", thinking.as_ref().map(|v| v as _)),
                ("temperature", temperature.as_ref().map(|v| v as _)),
                ("context_management", context_management.as_ref().map(|v| v as _)),
                ("output_config", output_config.as_ref().map(|v| v as _)),
                ("cache_control", cache_control.as_ref().map(|v| v as _)),
                ("stream", stream.as_ref().map(|v| v as _)),
            ];
            for (key, value) in fields {
                if let Some(value) = value {
                    map.serialize_key(key).expect("hashing never fails");
                    value.hash_into(map);
                }
            }
            for (key, value) in extra {
                map.serialize_entry(key, value).expect("hashing never fails");
            }
            map.serialize_key("messages").expect("hashing never fails");
            hasher.tag(b'[');
            hasher.state.flush();
            self.checkpoints.clear();
            self.checkpoints.push(hasher.state.hasher.clone());
            self.head = Some(Request {
                model: model.clone(),
                messages: Vec::new(),
                system: system.clone(),
                tools: tools.clone(),
                tool_choice: tool_choice.clone(),
                metadata: metadata.clone(),
                max_tokens: *max_tokens,
                thinking: thinking.clone(),
                temperature: temperature.clone(),
                context_management: context_management.clone(),
                output_config: output_config.clone(),
                cache_control: cache_control.clone(),
                stream: *stream,
                extra: extra.clone(),
            });
        }
        // Inside the top-level map and the `messages` array.
        hasher.depth = 2;
        for message in &messages[self.checkpoints.len() - 1..] {
            message.serialize(&mut hasher).expect("hashing never fails");
            hasher.state.flush();
            self.checkpoints.push(hasher.state.hasher.clone());
        }
        hasher.depth = 1;
        hasher.tag(b']');
        SerializeMap::end(&mut hasher).expect("hashing never fails");
        hasher.state.finish_hex()
    }
}

/// Object-safe serialization into the body hasher (the optional fields have different types).
mod erased {
    use super::{Serialize, Sha256Sink, StructHasher};

    pub trait Value {
        fn hash_into(&self, hasher: &mut StructHasher<Sha256Sink>);
    }

    impl<T: Serialize + ?Sized> Value for T {
        fn hash_into(&self, hasher: &mut StructHasher<Sha256Sink>) {
            self.serialize(hasher).expect("hashing never fails");
        }
    }
}

/// Where the structural stream goes.
trait Sink {
    fn update(&mut self, bytes: &[u8]);
}

/// xxh3 fed through a small buffer: the stream is mostly tags and lengths of a few bytes each,
/// and each call into the streaming hasher costs more than copying them. The digest depends on
/// the bytes only, not on how they were cut.
struct XxhSink {
    state: Xxh3,
    buf: [u8; XxhSink::CAPACITY],
    len: usize,
}

impl Default for XxhSink {
    fn default() -> Self {
        XxhSink { state: Xxh3::new(), buf: [0; XxhSink::CAPACITY], len: 0 }
    }
}

impl XxhSink {
    const CAPACITY: usize = 512;

    fn digest128(&mut self) -> u128 {
        self.state.update(&self.buf[..self.len]);
        self.len = 0;
        self.state.digest128()
    }
}

impl Sink for XxhSink {
    fn update(&mut self, bytes: &[u8]) {
        if self.len + bytes.len() > Self::CAPACITY {
            self.state.update(&self.buf[..self.len]);
            self.len = 0;
            if bytes.len() >= Self::CAPACITY {
                self.state.update(bytes);
                return;
            }
        }
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }
}

/// SHA-256 fed in 8 KiB chunks (its per-call overhead is high for the many tiny tags).
struct Sha256Sink {
    hasher: sha2::Sha256,
    buf: Vec<u8>,
}

impl Sha256Sink {
    fn flush(&mut self) {
        use sha2::Digest;
        self.hasher.update(&self.buf);
        self.buf.clear();
    }

    fn finish_hex(mut self) -> String {
        use sha2::Digest;
        self.flush();
        super::canonical::hex(&self.hasher.finalize())
    }
}

impl Sink for Sha256Sink {
    fn update(&mut self, bytes: &[u8]) {
        if self.buf.len() + bytes.len() > 8192 {
            self.flush();
        }
        if bytes.len() >= 8192 {
            use sha2::Digest;
            self.hasher.update(bytes);
        } else {
            self.buf.extend_from_slice(bytes);
        }
    }
}

struct StructHasher<S: Sink> {
    state: S,
    depth: u32,
    bytes: u64,
    /// The next map value belongs to a skipped key.
    skip_next_value: bool,
    /// Leave out the top-level `cache_control` (block hashes) or keep it (body hashes).
    skip_markers: bool,
}

#[derive(Debug)]
struct Never;

impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("structural hashing failed")
    }
}

impl std::error::Error for Never {}

impl ser::Error for Never {
    fn custom<M: std::fmt::Display>(_: M) -> Self {
        Never
    }
}

impl<S: Sink> StructHasher<S> {
    fn tag(&mut self, tag: u8) {
        self.state.update(&[tag]);
    }

    fn bytes(&mut self, tag: u8, bytes: &[u8]) {
        self.state.update(&[tag]);
        self.state.update(&(bytes.len() as u64).to_le_bytes());
        self.state.update(bytes);
        self.bytes += bytes.len() as u64 + 1;
    }
}

/// A sink for the value of a skipped field.
struct Skip;

macro_rules! skip_compound {
    ($($trait:ident, $method:ident $(, $extra:ident)?);*) => {
        $(impl ser::$trait for Skip {
            type Ok = ();
            type Error = Never;
            fn $method<T: Serialize + ?Sized>(&mut self, $($extra: &'static str,)? _value: &T) -> Result<(), Never> {
                Ok(())
            }
            fn end(self) -> Result<(), Never> {
                Ok(())
            }
        })*
    };
}

skip_compound!(SerializeSeq, serialize_element; SerializeTuple, serialize_element; SerializeTupleStruct, serialize_field;
    SerializeTupleVariant, serialize_field; SerializeStruct, serialize_field, _key; SerializeStructVariant, serialize_field, _key);

impl ser::SerializeMap for Skip {
    type Ok = ();
    type Error = Never;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, _key: &T) -> Result<(), Never> {
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, _value: &T) -> Result<(), Never> {
        Ok(())
    }
    fn end(self) -> Result<(), Never> {
        Ok(())
    }
}

/// Catches a map key to decide whether its value is skipped.
struct KeyCatcher<'a, S: Sink> {
    hasher: &'a mut StructHasher<S>,
}

impl<'a, S: Sink> KeyCatcher<'a, S> {
    fn key(self, key: &str) -> Result<(), Never> {
        if self.hasher.skip_markers && self.hasher.depth == 1 && (key == "cache_control" || key == "cache_reference") {
            self.hasher.skip_next_value = true;
            return Ok(());
        }
        self.hasher.bytes(b'k', key.as_bytes());
        Ok(())
    }
}

macro_rules! key_not_string {
    ($($method:ident($($arg:ident: $ty:ty),*));*) => {
        $(fn $method(self, $($arg: $ty),*) -> Result<(), Never> {
            $(let _ = $arg;)*
            Err(Never)
        })*
    };
}

impl<'a, S: Sink> ser::Serializer for KeyCatcher<'a, S> {
    type Ok = ();
    type Error = Never;
    type SerializeSeq = Skip;
    type SerializeTuple = Skip;
    type SerializeTupleStruct = Skip;
    type SerializeTupleVariant = Skip;
    type SerializeMap = Skip;
    type SerializeStruct = Skip;
    type SerializeStructVariant = Skip;

    fn serialize_str(self, v: &str) -> Result<(), Never> {
        self.key(v)
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Result<(), Never> {
        self.key(variant)
    }
    key_not_string!(serialize_bool(v: bool); serialize_i8(v: i8); serialize_i16(v: i16); serialize_i32(v: i32); serialize_i64(v: i64);
        serialize_u8(v: u8); serialize_u16(v: u16); serialize_u32(v: u32); serialize_u64(v: u64); serialize_f32(v: f32);
        serialize_f64(v: f64); serialize_char(v: char); serialize_bytes(v: &[u8]); serialize_none(); serialize_unit();
        serialize_unit_struct(n: &'static str));
    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<(), Never> {
        Err(Never)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<(), Never> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(self, _: &'static str, _: u32, _: &'static str, _: &T) -> Result<(), Never> {
        Err(Never)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Skip, Never> {
        Err(Never)
    }
    fn serialize_tuple(self, _: usize) -> Result<Skip, Never> {
        Err(Never)
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Skip, Never> {
        Err(Never)
    }
    fn serialize_tuple_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Skip, Never> {
        Err(Never)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Skip, Never> {
        Err(Never)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Skip, Never> {
        Err(Never)
    }
    fn serialize_struct_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Skip, Never> {
        Err(Never)
    }
}

impl<S: Sink> ser::Serializer for &mut StructHasher<S> {
    type Ok = ();
    type Error = Never;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    fn serialize_bool(self, v: bool) -> Result<(), Never> {
        self.tag(if v { b'T' } else { b'F' });
        self.bytes += 1;
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), Never> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i16(self, v: i16) -> Result<(), Never> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i32(self, v: i32) -> Result<(), Never> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i64(self, v: i64) -> Result<(), Never> {
        // Non-negative integers hash as unsigned, as JSON cannot tell them apart.
        if v >= 0 {
            return self.serialize_u64(v as u64);
        }
        self.tag(b'i');
        self.state.update(&v.to_le_bytes());
        self.bytes += 1;
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Result<(), Never> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u16(self, v: u16) -> Result<(), Never> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u32(self, v: u32) -> Result<(), Never> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u64(self, v: u64) -> Result<(), Never> {
        self.tag(b'u');
        self.state.update(&v.to_le_bytes());
        self.bytes += 1;
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Result<(), Never> {
        self.serialize_f64(f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<(), Never> {
        self.tag(b'f');
        self.state.update(&v.to_bits().to_le_bytes());
        self.bytes += 1;
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), Never> {
        let mut buf = [0u8; 4];
        self.serialize_str(v.encode_utf8(&mut buf))
    }
    fn serialize_str(self, v: &str) -> Result<(), Never> {
        self.bytes(b's', v.as_bytes());
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Never> {
        self.bytes(b'b', v);
        Ok(())
    }
    fn serialize_none(self) -> Result<(), Never> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Never> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Never> {
        self.tag(b'n');
        self.bytes += 1;
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Never> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Result<(), Never> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<(), Never> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(self, _: &'static str, _: u32, variant: &'static str, value: &T) -> Result<(), Never> {
        self.tag(b'{');
        self.depth += 1;
        self.bytes(b'k', variant.as_bytes());
        value.serialize(&mut *self)?;
        self.depth -= 1;
        self.tag(b'}');
        Ok(())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self, Never> {
        self.tag(b'[');
        self.depth += 1;
        Ok(self)
    }
    fn serialize_tuple(self, len: usize) -> Result<Self, Never> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Self, Never> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(self, _: &'static str, _: u32, variant: &'static str, _: usize) -> Result<Self, Never> {
        self.tag(b'{');
        self.bytes(b'k', variant.as_bytes());
        self.tag(b'[');
        self.depth += 1;
        Ok(self)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self, Never> {
        self.tag(b'{');
        self.depth += 1;
        Ok(self)
    }
    fn serialize_struct(self, _: &'static str, len: usize) -> Result<Self, Never> {
        self.serialize_map(Some(len))
    }
    fn serialize_struct_variant(self, _: &'static str, _: u32, variant: &'static str, _: usize) -> Result<Self, Never> {
        self.tag(b'{');
        self.bytes(b'k', variant.as_bytes());
        self.tag(b'{');
        self.depth += 1;
        Ok(self)
    }
}

impl<S: Sink> ser::SerializeSeq for &mut StructHasher<S> {
    type Ok = ();
    type Error = Never;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Never> {
        value.serialize(&mut **self)
    }
    fn end(self) -> Result<(), Never> {
        self.depth -= 1;
        self.tag(b']');
        Ok(())
    }
}

impl<S: Sink> ser::SerializeTuple for &mut StructHasher<S> {
    type Ok = ();
    type Error = Never;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Never> {
        value.serialize(&mut **self)
    }
    fn end(self) -> Result<(), Never> {
        ser::SerializeSeq::end(self)
    }
}

impl<S: Sink> ser::SerializeTupleStruct for &mut StructHasher<S> {
    type Ok = ();
    type Error = Never;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Never> {
        value.serialize(&mut **self)
    }
    fn end(self) -> Result<(), Never> {
        ser::SerializeSeq::end(self)
    }
}

impl<S: Sink> ser::SerializeTupleVariant for &mut StructHasher<S> {
    type Ok = ();
    type Error = Never;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Never> {
        value.serialize(&mut **self)
    }
    fn end(self) -> Result<(), Never> {
        self.depth -= 1;
        self.tag(b']');
        self.tag(b'}');
        Ok(())
    }
}

impl<S: Sink> ser::SerializeMap for &mut StructHasher<S> {
    type Ok = ();
    type Error = Never;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Never> {
        key.serialize(KeyCatcher { hasher: &mut **self })
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Never> {
        if std::mem::take(&mut self.skip_next_value) {
            return Ok(());
        }
        value.serialize(&mut **self)
    }
    fn end(self) -> Result<(), Never> {
        self.depth -= 1;
        self.tag(b'}');
        Ok(())
    }
}

impl<S: Sink> ser::SerializeStruct for &mut StructHasher<S> {
    type Ok = ();
    type Error = Never;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Never> {
        if self.skip_markers && self.depth == 1 && (key == "cache_control" || key == "cache_reference") {
            return Ok(());
        }
        self.bytes(b'k', key.as_bytes());
        value.serialize(&mut **self)
    }
    fn end(self) -> Result<(), Never> {
        ser::SerializeMap::end(self)
    }
}

impl<S: Sink> ser::SerializeStructVariant for &mut StructHasher<S> {
    type Ok = ();
    type Error = Never;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Never> {
        self.bytes(b'k', key.as_bytes());
        value.serialize(&mut **self)
    }
    fn end(self) -> Result<(), Never> {
        self.depth -= 1;
        self.tag(b'}');
        self.tag(b'}');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CacheControl, ContentBlock};
    use serde_json::{Value, json};

    #[test]
    fn equal_json_hashes_alike_and_markers_are_ignored() {
        let mut a = ContentBlock::text("hello");
        let b = ContentBlock::text("hello");
        a.set_cache_control(Some(CacheControl::ephemeral()));
        assert_eq!(block_hash(b"user", &a).0, block_hash(b"user", &b).0);
        // The same block as an untyped JSON value hashes alike too.
        let value = json!({"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}});
        assert_eq!(block_hash(b"user", &value).0, block_hash(b"user", &b).0);
    }

    #[test]
    fn the_resumable_body_hash_is_the_body_hash() {
        // Every optional field present, unmodelled ones too: the hand-written top level must
        // write what `#[derive(Serialize)]` writes.
        let full: Request = serde_json::from_value(json!({
            "model": "m", "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": [{"type": "text", "text": "b"}], "x": 1}],
            "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "t", "input_schema": {"type": "object"}}], "tool_choice": {"type": "auto"},
            "metadata": {"user_id": "u"}, "max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": 1024},
            "temperature": 0.5, "context_management": {"edits": []}, "output_config": {"effort": "high"},
            "cache_control": {"type": "ephemeral"}, "stream": true, "service_tier": "auto", "top_k": 3
        }))
        .unwrap();
        let bare: Request = serde_json::from_value(json!({"model": "m", "messages": []})).unwrap();
        // The definition: the body's JSON with `messages` moved to the end, hashed whole.
        let reference = |body: &Request| {
            let Value::Object(mut map) = serde_json::to_value(body).unwrap() else { unreachable!() };
            let messages = map.shift_remove("messages").unwrap();
            map.insert("messages".into(), messages);
            sha256_hex(&Value::Object(map))
        };
        for body in [&full, &bare] {
            assert_eq!(body_sha256(body), reference(body));
        }
        // Resumed after the identical first message, and after all of them.
        let mut hasher = BodyHasher::default();
        hasher.sha256_hex(&full, 0);
        let mut longer = full.clone();
        longer.messages.push(crate::api::Message::user_text("c"));
        assert_eq!(hasher.sha256_hex(&longer, 2), reference(&longer));
        assert_eq!(hasher.sha256_hex(&full, 2), reference(&full));
        let mut edited = full.clone();
        edited.messages[1] = crate::api::Message::user_text("changed");
        assert_eq!(hasher.sha256_hex(&edited, 1), reference(&edited));
        // A changed head (system, an unmodelled field) is hashed again whatever `reuse` says.
        let mut new_system = edited.clone();
        new_system.system = Some(crate::api::SystemPrompt::Text("other".into()));
        assert_eq!(hasher.sha256_hex(&new_system, 2), reference(&new_system));
        let mut new_extra = new_system.clone();
        new_extra.extra.insert("top_k".into(), json!(4));
        assert_eq!(hasher.sha256_hex(&new_extra, 2), reference(&new_extra));
        assert_ne!(reference(&new_extra), reference(&new_system));
    }

    #[test]
    fn key_order_strings_and_tags_matter() {
        let h = |v: serde_json::Value| block_hash(b"t", &v).0;
        assert_ne!(h(json!({"a": 1, "b": 2})), h(json!({"b": 2, "a": 1})));
        assert_ne!(h(json!({"a": "1"})), h(json!({"a": 1})));
        assert_ne!(h(json!(["ab", "c"])), h(json!(["a", "bc"])));
        assert_ne!(block_hash(b"user", &json!("x")).0, block_hash(b"assistant", &json!("x")).0);
        // A nested cache_control is content, not a marker.
        assert_ne!(h(json!({"a": {"cache_control": 1}})), h(json!({"a": {}})));
    }
}
