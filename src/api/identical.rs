//! Exact sameness of two wire values, as every hash in ctxsim sees them.
//!
//! `a.identical(&b)` implies that `a` and `b` serialize to the same structural stream
//! ([`super::structural`]): same variants, same fields, map keys in the same order, numbers of
//! the same kind and bits. It is stricter than `==`, which treats JSON objects as unordered
//! (`serde_json::Map` compares by key lookup) and `0.0` as equal to `-0.0`; the structural hashes
//! keep both differences, so only this comparison may stand in for them.
//!
//! The measurement uses it to reuse what it computed for the previous request of a session: a
//! block identical to the one at the same place before has the same hash, token count and
//! body bytes, and comparing costs about a `memcmp` of the block, far less than hashing it.
//! Every struct is destructured without `..`, so a field added to a wire type fails to compile
//! here until it is compared.

use serde_json::{Map, Number, Value};

use super::{
    CacheControl, CacheScope, CacheTtl, ContentBlock, ImageLike, Message, MessageContent, Role, SharedBlocks, SharedValue, SharedVec, SystemBlock,
    SystemPrompt, Tool, ToolResultContent,
};

/// Exact structural sameness (see the module documentation).
pub trait Identical {
    fn identical(&self, other: &Self) -> bool;
}

macro_rules! by_eq {
    ($($ty:ty),*) => {
        $(impl Identical for $ty {
            fn identical(&self, other: &Self) -> bool {
                self == other
            }
        })*
    };
}

by_eq!(String, str, bool, u64, Role, CacheTtl, CacheScope);

impl<T: Identical> Identical for Option<T> {
    fn identical(&self, other: &Self) -> bool {
        match (self, other) {
            (None, None) => true,
            (Some(a), Some(b)) => a.identical(b),
            _ => false,
        }
    }
}

impl<T: Identical> Identical for [T] {
    fn identical(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().zip(other).all(|(a, b)| a.identical(b))
    }
}

impl<T: Identical> Identical for Vec<T> {
    fn identical(&self, other: &Self) -> bool {
        self.as_slice().identical(other.as_slice())
    }
}

/// The same allocation is identical without a look at the blocks: a history shared by two
/// bodies compares for the price of a pointer.
impl Identical for SharedBlocks {
    fn identical(&self, other: &Self) -> bool {
        self.same(other) || self.as_slice().identical(other.as_slice())
    }
}

/// The same allocation is identical without a look at the list: tools and system blocks shared
/// by two bodies compare for the price of a pointer.
impl<T: Identical> Identical for SharedVec<T> {
    fn identical(&self, other: &Self) -> bool {
        self.same(other) || self.as_slice().identical(other.as_slice())
    }
}

/// Same kind (unsigned, negative, float) and same value bits.
fn number_identical(a: &Number, b: &Number) -> bool {
    match (a.as_u64(), b.as_u64()) {
        (Some(x), Some(y)) => x == y,
        (None, None) => match (a.as_i64(), b.as_i64()) {
            (Some(x), Some(y)) => x == y,
            (None, None) => a.as_f64().map(f64::to_bits) == b.as_f64().map(f64::to_bits),
            _ => false,
        },
        _ => false,
    }
}

/// One allocation is the same value; else compared as values.
impl Identical for SharedValue {
    fn identical(&self, other: &Self) -> bool {
        self.same(other) || (**self).identical(&**other)
    }
}

impl Identical for Value {
    fn identical(&self, other: &Self) -> bool {
        match (self, other) {
            (Value::Null, Value::Null) => true,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::Number(a), Value::Number(b)) => number_identical(a, b),
            (Value::String(a), Value::String(b)) => a == b,
            (Value::Array(a), Value::Array(b)) => a.identical(b),
            (Value::Object(a), Value::Object(b)) => a.identical(b),
            _ => false,
        }
    }
}

/// Same entries in the same order.
impl Identical for Map<String, Value> {
    fn identical(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().zip(other).all(|((ka, va), (kb, vb))| ka == kb && va.identical(vb))
    }
}

/// Implements [`Identical`] for a struct field by field; the destructuring has no `..`, so a
/// new field is a compile error until it is listed.
macro_rules! by_fields {
    ($ty:ident { $($field:ident),* $(,)? }) => {
        impl Identical for $ty {
            fn identical(&self, other: &Self) -> bool {
                let $ty { $($field: _),* } = self;
                true $(&& self.$field.identical(&other.$field))*
            }
        }
    };
}

by_fields!(CacheControl { kind, ttl, scope, extra });
by_fields!(ImageLike { source, cache_control, extra });
by_fields!(Message { role, content, extra });
by_fields!(SystemBlock { kind, text, cache_control, extra });
by_fields!(Tool { kind, name, description, input_schema, cache_control, defer_loading, extra });

/// Implements [`Identical`] for the string-or-list enums (`Text(String)` or `Blocks(Vec<_>)`).
macro_rules! text_or_blocks {
    ($($ty:ident),*) => {
        $(impl Identical for $ty {
            fn identical(&self, other: &Self) -> bool {
                match (self, other) {
                    ($ty::Text(a), $ty::Text(b)) => a == b,
                    ($ty::Blocks(a), $ty::Blocks(b)) => a.identical(b),
                    _ => false,
                }
            }
        })*
    };
}

text_or_blocks!(MessageContent, ToolResultContent, SystemPrompt);

impl Identical for ContentBlock {
    fn identical(&self, other: &Self) -> bool {
        use ContentBlock as B;
        match (self, other) {
            (B::Text { text: a, cache_control: ca, extra: ea }, B::Text { text: b, cache_control: cb, extra: eb }) => {
                a == b && ca.identical(cb) && ea.identical(eb)
            }
            (B::Image(a), B::Image(b)) | (B::Document(a), B::Document(b)) => a.identical(b),
            (
                B::ToolUse { id: ia, name: na, input: xa, cache_control: ca, extra: ea },
                B::ToolUse { id: ib, name: nb, input: xb, cache_control: cb, extra: eb },
            )
            | (
                B::ServerToolUse { id: ia, name: na, input: xa, cache_control: ca, extra: ea },
                B::ServerToolUse { id: ib, name: nb, input: xb, cache_control: cb, extra: eb },
            ) => ia == ib && na == nb && xa.identical(xb) && ca.identical(cb) && ea.identical(eb),
            (
                B::ToolResult { tool_use_id: ia, content: xa, is_error: ra, cache_control: ca, extra: ea },
                B::ToolResult { tool_use_id: ib, content: xb, is_error: rb, cache_control: cb, extra: eb },
            ) => ia == ib && xa.identical(xb) && ra.identical(rb) && ca.identical(cb) && ea.identical(eb),
            (
                B::Thinking { thinking: ta, signature: sa, extra: ea },
                B::Thinking { thinking: tb, signature: sb, extra: eb },
            ) => ta == tb && sa == sb && ea.identical(eb),
            (B::RedactedThinking { data: a, extra: ea }, B::RedactedThinking { data: b, extra: eb }) => a == b && ea.identical(eb),
            (B::ToolReference { tool_name: a, extra: ea }, B::ToolReference { tool_name: b, extra: eb }) => {
                a == b && ea.identical(eb)
            }
            (
                B::FinalToolResult { tool_use_id: ia, content: xa, is_error: ra, cache_control: ca, extra: ea },
                B::FinalToolResult { tool_use_id: ib, content: xb, is_error: rb, cache_control: cb, extra: eb },
            ) => ia == ib && xa.identical(xb) && ra.identical(rb) && ca.identical(cb) && ea.identical(eb),
            // A finalized result and a raw JSON tool_result: as the raw forms compare.
            (final_result @ B::FinalToolResult { .. }, B::Other(raw)) | (B::Other(raw), final_result @ B::FinalToolResult { .. }) => {
                raw.get("type").and_then(Value::as_str) == Some("tool_result") && final_result.wire_value().is_some_and(|value| value.identical(raw))
            }
            (B::Other(a), B::Other(b)) => a.identical(b),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::structural::block_hash;
    use serde_json::json;

    fn block(value: Value) -> ContentBlock {
        ContentBlock::from_value(value).unwrap()
    }

    #[test]
    fn stricter_than_eq_where_the_hashes_are() {
        // Key order: `==` says equal, the structural hash and `identical` say different.
        let a = block(json!({"type": "tool_use", "id": "t", "name": "Edit", "input": {"a": 1, "b": 2}}));
        let b = block(json!({"type": "tool_use", "id": "t", "name": "Edit", "input": {"b": 2, "a": 1}}));
        assert_eq!(a, b);
        assert_ne!(block_hash(b"user", &a).0, block_hash(b"user", &b).0);
        assert!(!a.identical(&b));
        // The sign of zero and the kind of a number.
        assert!(!json!(0.0).identical(&json!(-0.0)));
        assert!(!json!(1).identical(&json!(1.0)));
        assert!(!json!(-1).identical(&json!(1)));
        assert!(json!({"x": [1, -2, 0.5, null, "s"]}).identical(&json!({"x": [1, -2, 0.5, null, "s"]})));
    }

    #[test]
    fn markers_and_forms_count() {
        let plain = ContentBlock::text("hi");
        let mut marked = plain.clone();
        marked.set_cache_control(Some(CacheControl::ephemeral()));
        assert!(plain.identical(&plain.clone()));
        assert!(!plain.identical(&marked));
        // A string content and one text block hash alike as blocks, but are different bodies.
        let string = MessageContent::Text("hi".into());
        let blocks = MessageContent::Blocks(vec![ContentBlock::text("hi")].into());
        assert!(!string.identical(&blocks));
    }
}
