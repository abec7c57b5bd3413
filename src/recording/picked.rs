//! The transcript importer's parse of one record line: `serde_json::Value`'s parse of the
//! record object, building only the fields the importer reads of it.
//!
//! A whole `Value` of a line builds every string, number and map entry of it (a `String` and a
//! hashed map insert each): the envelope fields no reader takes (`gitBranch`, `slug`,
//! `userType`, ...), a `progress` record's `data` (an agent's whole message), a file-history
//! snapshot, a reply's envelope (`role`, `container`, `context_management`, `diagnostics`...).
//! [`record`] builds the entries of [`RECORD_FIELDS`] (of `data`, those of [`DATA_FIELDS`]; of
//! `message`, those of [`MESSAGE_FIELDS`]) as the `Value` parse builds them, and reads every
//! other entry through the same deserializer calls (`deserialize_any`, the same string, number
//! and depth checks) without building it. So a line parses here exactly when its `Value` parse
//! gives an object (with a `data` and a `message` that are objects when it has them), and what
//! it gives is that object with only those fields: the same values, in the same order, the last
//! of a repeated key winning where the first stood. A line it does not take (no object, no
//! UTF-8, a `data` or `message` of another kind, serde's raw value marker as an object's first
//! key) goes to the `Value` parse, which names the failure.
//!
//! A message's `usage` is read as its JSON text first (the importer compares it with the last
//! chunk's of a streamed message), then built from the text as the parse builds it in place
//! ([`usage_value`]); a text the caller gives as repeated is not built at all.

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::fmt;

/// The top-level fields the importer reads of a record it takes from its fields alone
/// (`claude_code::FileImporter::record` and what it calls, for every record type but those
/// `reads_whole_record` sends to the whole parse).
pub(crate) const RECORD_FIELDS: &[&str] = &[
    "type",
    "subtype",
    "uuid",
    "parentUuid",
    "timestamp",
    "sessionId",
    "cwd",
    "entrypoint",
    "version",
    "isSidechain",
    "agentId",
    "message",
    "requestId",
    "requestRef",
    "isApiErrorMessage",
    "isMeta",
    "isCompactSummary",
    "permissionMode",
    "toolUseResult",
    "attachment",
    "toolUseID",
    "parentToolUseID",
    "data",
];

/// The fields of a `progress` record's `data` the importer reads (of a hook's progress other than
/// `SessionStart`'s, and of an agent's).
pub(crate) const DATA_FIELDS: &[&str] = &["type", "hookEvent", "hookName", "agentId"];

/// The fields of a record's `message` the importer reads (`FileImporter::user`, `assistant`,
/// `note_call_time`, and the content and id an `api-request` file indexes).
pub(crate) const MESSAGE_FIELDS: &[&str] = &["content", "usage", "stop_reason", "model", "id"];

/// The fields of an object field of [`RECORD_FIELDS`] that [`record`] builds, the others it
/// reads without building: `None` for a field built whole.
fn nested_fields(key: &str) -> Option<&'static [&'static str]> {
    match key {
        "data" => Some(DATA_FIELDS),
        "message" => Some(MESSAGE_FIELDS),
        _ => None,
    }
}

/// The key a `Value` parse with serde_json's `raw_value` feature reads, as an object's first key,
/// as the mark of a raw value rather than as a key.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// The record of a line that is UTF-8 text with only its [`RECORD_FIELDS`] (and `data`'s
/// [`DATA_FIELDS`], `message`'s [`MESSAGE_FIELDS`]); `None` for a line the `Value` parse is to
/// read (module doc). `message.usage` is read as its JSON text and built from it
/// ([`usage_value`]), unless the text is `repeated`: it is then left out of the message, not
/// built ([`Fields::usage_repeated`]), its value being [`usage_value`] of that text (one it
/// takes: a usage built before).
pub(crate) fn record(text: &str, repeated: Option<&str>) -> Option<Fields> {
    debug_assert!(repeated.is_none_or(|text| usage_value(text).is_ok()), "a repeated usage that does not parse");
    let mut de = serde_json::Deserializer::from_str(text);
    let record = PickedRecord { repeated }.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(record)
}

/// The `Value` of a `message.usage` JSON text as a record line's parse builds it there: inside
/// two objects (the record and its message), which the parse's depth limit counts, as inside
/// two arrays here. An error where the parse in place fails.
pub(crate) fn usage_value(text: &str) -> Result<Value, serde_json::Error> {
    let mut wrapped = String::with_capacity(text.len() + 4);
    wrapped.push_str("[[");
    wrapped.push_str(text);
    wrapped.push_str("]]");
    let [[value]] = serde_json::from_str::<[[Value; 1]; 1]>(&wrapped)?;
    Ok(value)
}

/// A record's [`RECORD_FIELDS`], each in its slot (a `Value` as the whole parse builds it; `data`
/// an object of [`DATA_FIELDS`], `message` of [`MESSAGE_FIELDS`]): no key built, hashed or looked
/// up in a map.
#[derive(Debug, Default)]
pub(crate) struct Fields {
    slots: [Option<Value>; RECORD_FIELDS.len()],
    /// The JSON text of `message.usage` (of the last `message`), and whether it is the one
    /// [`record`] was given as repeated, the message then holding no `usage`.
    usage: Option<(String, bool)>,
}

impl Fields {
    /// The slot of `key`, one of [`RECORD_FIELDS`]: reading another field of a picked record is a
    /// bug (the importer would read it as absent), so it panics.
    fn slot(key: &str) -> usize {
        RECORD_FIELDS.iter().position(|field| *field == key).unwrap_or_else(|| {
            panic!("the importer reads field `{key}` of a picked record: add it to picked::RECORD_FIELDS")
        })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.slots[Self::slot(key)].as_ref()
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Value> {
        self.slots[Self::slot(key)].as_mut()
    }

    pub fn remove(&mut self, key: &str) -> Option<Value> {
        self.slots[Self::slot(key)].take()
    }

    /// The JSON text of `message.usage` and whether it was the repeated one (left out of the
    /// message), taken.
    pub fn take_usage(&mut self) -> Option<(String, bool)> {
        self.usage.take()
    }

    /// Whether `message.usage` was left out as the repeated text.
    pub fn usage_repeated(&self) -> bool {
        self.usage.as_ref().is_some_and(|(_, repeated)| *repeated)
    }

    /// The fields as a map in [`RECORD_FIELDS`]' order (for the debug checks and the tests).
    pub fn to_map(&self) -> Map<String, Value> {
        RECORD_FIELDS.iter().zip(&self.slots).filter_map(|(key, value)| Some(((*key).to_owned(), value.clone()?))).collect()
    }
}

/// `whole` (a line's `Value` parse) as [`record`] reads it, as a map in [`RECORD_FIELDS`]'
/// order: the same as [`Fields::to_map`] of [`record`] of the line.
pub(crate) fn filtered_in_field_order(whole: &Map<String, Value>) -> Map<String, Value> {
    let filtered = filtered(whole);
    RECORD_FIELDS.iter().filter_map(|key| Some(((*key).to_owned(), filtered.get(*key)?.clone()))).collect()
}

/// The top-level object of a record line, into [`Fields`]; `repeated` is [`record`]'s.
struct PickedRecord<'a> {
    repeated: Option<&'a str>,
}

impl<'de> DeserializeSeed<'de> for PickedRecord<'_> {
    type Value = Fields;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PickedRecord<'_> {
    type Value = Fields;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = Fields::default();
        let mut first = true;
        while let Some(key) = next_key(&mut map, &mut first)? {
            match RECORD_FIELDS.iter().position(|field| *field == key) {
                // A repeated key: the last value wins, as in the whole parse's map.
                Some(slot) => match nested_fields(&key) {
                    Some(fields_of) => {
                        let mut usage = None;
                        let usage_of = (key == "message").then_some((&mut usage, self.repeated));
                        fields.slots[slot] = Some(Value::Object(map.next_value_seed(Picked { fields: fields_of, usage: usage_of })?));
                        if key == "message" {
                            fields.usage = usage.map(|(text, repeated): (&str, bool)| (text.to_owned(), repeated));
                        }
                    }
                    None => fields.slots[slot] = Some(map.next_value()?),
                },
                None => {
                    map.next_value::<Checked>()?;
                }
            }
        }
        Ok(fields)
    }
}

/// `whole` (a line's `Value` parse) with only the fields [`record`] builds: what [`record`]
/// gives for the same line. For the debug checks and the tests.
pub(crate) fn filtered(whole: &Map<String, Value>) -> Map<String, Value> {
    let mut picked = Map::new();
    for (key, value) in whole {
        if let Some(nested) = nested_fields(key) {
            let Value::Object(object) = value else { panic!("a picked record's {key} is an object, not {value}") };
            let object = object.iter().filter(|(k, _)| nested.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
            picked.insert(key.clone(), Value::Object(object));
        } else if RECORD_FIELDS.contains(&key.as_str()) {
            picked.insert(key.clone(), value.clone());
        }
    }
    picked
}

/// Whether two maps hold the same entries in the same order, nested maps too (a `Map`'s `==`
/// ignores order).
pub(crate) fn same_in_order(a: &Map<String, Value>, b: &Map<String, Value>) -> bool {
    fn same(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => same_in_order(a, b),
            (Value::Array(a), Value::Array(b)) => a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same(a, b)),
            _ => a == b,
        }
    }
    a.len() == b.len() && a.iter().zip(b).all(|((ka, va), (kb, vb))| ka == kb && same(va, vb))
}

/// An object, building only the entries of `fields`. A message's `usage` (`usage` given) is read
/// as its text, into the slot given, and built from it unless it is the repeated text given
/// ([`record`]), which is left out.
struct Picked<'a, 'de> {
    fields: &'static [&'static str],
    usage: Option<UsageOf<'a, 'de>>,
}

/// Where [`Picked`] puts a message's `usage` text (with whether it was the repeated one), and
/// the repeated text.
type UsageOf<'a, 'de> = (&'a mut Option<(&'de str, bool)>, Option<&'a str>);

impl<'de> DeserializeSeed<'de> for Picked<'_, 'de> {
    type Value = Map<String, Value>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Picked<'_, 'de> {
    type Value = Map<String, Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut picked = Map::new();
        let mut first = true;
        while let Some(key) = next_key(&mut map, &mut first)? {
            if key == "usage"
                && let Some((slot, repeated)) = &mut self.usage
            {
                // Read as text (serde_json's raw value: the same syntax checks, no depth limit,
                // which `usage_value` applies), borrowed from the line.
                let text = map.next_value::<&'de serde_json::value::RawValue>()?.get();
                let repeated = *repeated == Some(text);
                // The last of two usages wins where the first stood, as in the whole parse's
                // map: a repeated one stands there as null until the message is read.
                let value = if repeated { Value::Null } else { usage_value(text).map_err(de::Error::custom)? };
                picked.insert("usage".to_owned(), value);
                **slot = Some((text, repeated));
            } else if self.fields.contains(&key.as_ref()) {
                let value: Value = map.next_value()?;
                picked.insert(key.into_owned(), value);
            } else {
                map.next_value::<Checked>()?;
            }
        }
        if let Some((Some((_, true)), _)) = &self.usage {
            picked.shift_remove("usage");
        }
        Ok(picked)
    }
}

/// The next key of an object, refusing serde's raw value marker as its first key (the whole
/// parse reads that object as a raw value: left to it).
fn next_key<'de, A: MapAccess<'de>>(map: &mut A, first: &mut bool) -> Result<Option<Cow<'de, str>>, A::Error> {
    let key = map.next_key::<Key>()?.map(|Key(key)| key);
    if std::mem::take(first) && key.as_deref() == Some(RAW_VALUE_TOKEN) {
        return Err(de::Error::custom("raw value marker"));
    }
    Ok(key)
}

/// An object key, borrowed from the line where it has no escape.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E: de::Error>(self, key: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(key)))
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(key.to_owned())))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// Any value, read as `Value`'s parse reads it (`deserialize_any` all the way down, so the same
/// number, string and depth checks) and not built.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Checked)
    }
}

impl<'de> Visitor<'de> for Checked {
    type Value = Checked;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        let mut first = true;
        while next_key(&mut map, &mut first)?.is_some() {
            map.next_value::<Checked>()?;
        }
        Ok(Checked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// JSON text, valid or not: the values a transcript holds and the edge cases where a parse
    /// that skips could part from `Value`'s (numbers out of range, lone surrogates, control
    /// characters, the raw value marker, deep nesting, repeated keys, bad syntax).
    fn json(depth: u32) -> BoxedStrategy<String> {
        json_of(depth, true)
    }

    /// [`json`], or with `edges` false only valid JSON of the usual shapes (so most lines parse).
    fn json_of(depth: u32, edges: bool) -> BoxedStrategy<String> {
        let usual = prop_oneof![
            Just("null".to_owned()),
            Just("false".to_owned()),
            Just("7".to_owned()),
            Just("-0.25".to_owned()),
            Just("\"x\\ty\\u00e9\"".to_owned()),
            "[a-z ]{0,12}".prop_map(|s| format!("\"{s}\"")),
        ];
        if !edges {
            if depth == 0 {
                return usual.boxed();
            }
            let inner = json_of(depth - 1, false);
            let key = prop_oneof![
                prop::sample::select(RECORD_FIELDS).prop_map(str::to_owned),
                prop::sample::select(DATA_FIELDS).prop_map(str::to_owned),
                prop::sample::select(MESSAGE_FIELDS).prop_map(str::to_owned),
                "[a-zA-Z]{1,8}",
            ];
            return prop_oneof![
                3 => usual,
                1 => prop::collection::vec(inner.clone(), 0..4).prop_map(|items| format!("[{}]", items.join(","))),
                2 => prop::collection::vec((key, inner), 0..5).prop_map(|entries| {
                    let entries: Vec<String> = entries.into_iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                    format!("{{{}}}", entries.join(","))
                }),
            ]
            .boxed();
        }
        let leaf = prop_oneof![
            usual,
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("1".to_owned()),
            Just("-12.5e3".to_owned()),
            Just("1e999".to_owned()),
            Just("18446744073709551616".to_owned()),
            Just("\"a\\nb\\\"c\"".to_owned()),
            Just("\"\\ud800\"".to_owned()),
            Just("\"\\ud83d\\ude00\"".to_owned()),
            Just("\"tab\there\"".to_owned()),
            Just("\"\\x\"".to_owned()),
            Just("tru".to_owned()),
            "[a-z]{0,6}".prop_map(|s| format!("\"{s}\"")),
        ];
        if depth == 0 {
            return leaf.boxed();
        }
        let inner = json(depth - 1);
        let key = prop_oneof![
            prop::sample::select(RECORD_FIELDS).prop_map(str::to_owned),
            prop::sample::select(DATA_FIELDS).prop_map(str::to_owned),
            prop::sample::select(MESSAGE_FIELDS).prop_map(str::to_owned),
            Just("gitBranch".to_owned()),
            Just("slug".to_owned()),
            Just(RAW_VALUE_TOKEN.to_owned()),
            Just("ty\\u0070e".to_owned()),
        ];
        prop_oneof![
            3 => leaf,
            2 => prop::collection::vec(inner.clone(), 0..4).prop_map(|items| format!("[{}]", items.join(","))),
            4 => prop::collection::vec((key, inner), 0..6).prop_map(|entries| {
                let entries: Vec<String> = entries.into_iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                format!("{{{}}}", entries.join(","))
            }),
            1 => Just(format!("{}{}", "[".repeat(130), "]".repeat(130))),
            1 => Just("{\"a\":1,}".to_owned()),
        ]
        .boxed()
    }

    /// What [`record`] gives when the `Value` parse takes the line as an object whose `data`
    /// and `message`, if any, are objects: the object's [`filtered`] fields.
    fn check(text: &str) {
        let whole = serde_json::from_str::<Value>(text);
        match record(text, None) {
            Some(mut picked) => {
                let Ok(Value::Object(whole)) = whole else { panic!("picked a line the Value parse refuses: {text}") };
                assert!(same_in_order(&picked.to_map(), &filtered_in_field_order(&whole)), "{text}");
                // Given its usage's text as repeated, the line parses the same but for the usage
                // left out, which is that text's value.
                if let Some((usage, repeated)) = picked.take_usage() {
                    assert!(!repeated, "{text}");
                    let again = record(text, Some(&usage)).unwrap_or_else(|| panic!("a usage given as repeated refuses the line: {text}"));
                    assert!(again.usage_repeated(), "{text}");
                    let mut filtered = filtered_in_field_order(&whole);
                    let Some(Value::Object(message)) = filtered.get_mut("message") else { panic!("a usage outside a message: {text}") };
                    assert_eq!(message.shift_remove("usage").as_ref(), usage_value(&usage).ok().as_ref(), "{text}");
                    assert!(same_in_order(&again.to_map(), &filtered), "{text}");
                }
            }
            None => {
                if let Ok(Value::Object(whole)) = whole
                    && !["data", "message"].iter().any(|key| matches!(whole.get(*key), Some(object) if !object.is_object()))
                    && !text.contains(RAW_VALUE_TOKEN)
                {
                    panic!("the Value parse took a line the picked parse refused: {text}");
                }
            }
        }
    }

    proptest! {
        #[test]
        fn picked_record_is_the_value_parse_filtered(text in json(4)) {
            check(&text);
        }

        #[test]
        fn picked_record_of_a_record_is_the_value_parse_filtered(
            entries in prop::collection::vec((prop_oneof![prop::sample::select(RECORD_FIELDS), Just("gitBranch"), Just("slug")], json_of(3, false)), 0..10),
            data in prop::collection::vec((prop_oneof![prop::sample::select(DATA_FIELDS), Just("message")], json_of(2, false)), 0..4),
            message in prop::collection::vec((prop_oneof![prop::sample::select(MESSAGE_FIELDS), Just("role"), Just("container")], json_of(2, false)), 0..6),
            message_first in any::<bool>(),
        ) {
            let mut entries: Vec<String> = entries.into_iter().filter(|(k, _)| !["data", "message"].contains(k)).map(|(k, v)| format!("\"{k}\":{v}")).collect();
            let object = |fields: Vec<(&str, String)>| fields.into_iter().map(|(k, v)| format!("\"{k}\":{v}")).collect::<Vec<_>>().join(",");
            entries.push(format!("\"data\":{{{}}}", object(data)));
            let message = format!("\"message\":{{{}}}", object(message));
            if message_first { entries.insert(0, message) } else { entries.push(message) }
            let text = format!("{{{}}}", entries.join(","));
            // Valid JSON of an object with an object `data` and `message`: the picked parse takes it.
            prop_assert!(record(&text, None).is_some(), "{}", text);
            check(&text);
        }
    }

    #[test]
    fn edge_lines() {
        for text in [
            r#"{"type":"user","type":"assistant","gitBranch":"x"}"#,
            r#"{"data":{"type":"hook_progress","big":{"a":[1,2,{"b":"c"}]},"type":"agent_progress"},"data":{"agentId":"z"}}"#,
            r#"{"data":5}"#,
            r#"{"message":[1]}"#,
            r#"{"message":"m"}"#,
            r#"{"message":{"role":"assistant","content":"a","id":"m1","content":[{"type":"text","text":"b"}],"container":null,"usage":{"input_tokens":1}},"type":"assistant"}"#,
            r#"{"$serde_json::private::RawValue":"{}"}"#,
            r#"{"x":{"$serde_json::private::RawValue":"{}"}}"#,
            r#"{"x":1e999}"#,
            r#"{"x":"\ud800"}"#,
            r#"{"message":{"content":[{"type":"text","text":"a\u0000b"}]}} "#,
            r#"{"x":1} x"#,
            r#"[1]"#,
            "",
        ] {
            check(text);
        }
        // A usage read as text: given as the repeated one (byte for byte), it is not built; two
        // usages in a message go to the whole parse.
        let chunk = r#"{"message":{"id":"m","usage":{"input_tokens":1, "output_tokens":2},"content":[]},"type":"assistant"}"#;
        let usage = r#"{"input_tokens":1, "output_tokens":2}"#;
        let mut built = record(chunk, Some(r#"{"input_tokens":1,"output_tokens":2}"#)).expect("a record");
        assert_eq!(built.take_usage(), Some((usage.to_owned(), false)));
        assert!(built.get("message").is_some_and(|m| m["usage"]["output_tokens"] == 2));
        let mut left_out = record(chunk, Some(usage)).expect("a record");
        assert!(left_out.usage_repeated() && left_out.get("message").is_some_and(|m| m.get("usage").is_none()));
        assert_eq!(left_out.take_usage(), Some((usage.to_owned(), true)));
        // Of two usages the last wins, where the first stood; left out where it is the repeated one.
        let two = r#"{"message":{"usage":{},"id":"m","usage":{"a":1}}}"#;
        let built = record(two, Some("{}")).and_then(|r| r.get("message").cloned());
        assert_eq!(serde_json::to_string(&built).unwrap(), r#"{"usage":{"a":1},"id":"m"}"#);
        let mut left_out = record(two, Some(r#"{"a":1}"#)).expect("a record");
        assert_eq!(serde_json::to_string(&left_out.get("message")).unwrap(), r#"{"id":"m"}"#);
        assert_eq!(left_out.take_usage(), Some((r#"{"a":1}"#.to_owned(), true)));
        let deep = format!("{}{}", "[".repeat(126), "]".repeat(126));
        assert!(usage_value(&deep).is_err() && serde_json::from_str::<Value>(&deep).is_ok());
        check(&format!(r#"{{"message":{{"usage":{deep}}}}}"#));
        assert!(record(r#"{"slug":"s","uuid":"u"}"#, None).is_some_and(|r| r.to_map().len() == 1 && r.get("uuid").is_some_and(|u| u == "u")));
        // A reply's envelope is not built; what the importer reads of it is, in the line's order.
        let reply = r#"{"message":{"id":"m","role":"assistant","model":"x","stop_sequence":null,"content":[],"usage":{"output_tokens":1}}}"#;
        let built = record(reply, None).and_then(|r| r.get("message").cloned());
        assert_eq!(serde_json::to_string(&built).unwrap(), r#"{"id":"m","model":"x","content":[],"usage":{"output_tokens":1}}"#);
    }
}
