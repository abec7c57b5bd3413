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
//! it gives is that object's values of those fields, the last of a repeated key winning (in
//! the whole parse's map, where the first stood). A line it does not take (no object, no
//! UTF-8, a `data` or `message` of another kind, serde's raw value marker as an object's first
//! key) goes to the `Value` parse, which names the failure.
//!
//! Each field has its slot: no map is built for the record or its message, no key hashed. A
//! top-level field that is a string is kept as the line's text ([`Field::Str`], borrowed where it
//! has no escape), but for those the importer moves into its events ([`VALUE_FIELDS`]).
//!
//! A message's `content` array is read item by item as the importer reads it
//! ([`Content::Items`]): an object's entries kept in a list, each key once where it first stood
//! with its last value, as the parse's map keeps them, and handed to
//! `ContentBlock::from_entries`, the code of `ContentBlock::from_value` over a list that removes
//! an entry as the map does (the last entry takes its place). The blocks a block keeps whole
//! (a tool call's `input`, a result's inner blocks) are built as `Value`s. Where the caller asks
//! for the content as a value (a file with wire requests indexes it), it is built.
//!
//! A message's `usage` is read as its JSON text first (the importer compares it with the last
//! chunk's of a streamed message), then read from the text as [`Usage`] field by field, within
//! the same depth the parse in place counts ([`usage_read`]): the other entries of the usage
//! built as the parse builds them, no map of the whole; a usage that does not read so is built
//! as the parse builds it ([`usage_value`]) and left to the importer's reading of a whole
//! record's usage. A text the caller gives as repeated is not read at all.
//!
//! Debug builds parse every line taken here whole too and compare ([`assert_same_as_whole`]).

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use crate::api::{BlockEntries, ContentBlock, USAGE_FIELDS, Usage};
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
/// read (module doc). `message.usage` is read from its JSON text ([`usage_read`]), unless the
/// text is `repeated`: it is then not read ([`UsageRead::Repeated`]), its value being
/// [`usage_read`] of that text (one it takes: a usage read before). `message.content` is built
/// as a `Value` where `content_value`, read as [`Content`] otherwise.
pub(crate) fn record<'t>(text: &'t str, repeated: Option<&str>, content_value: bool) -> Option<Box<Fields<'t>>> {
    let mut de = serde_json::Deserializer::from_str(text);
    let mut record = PickedRecord { content_value }.deserialize(&mut de).ok()?;
    de.end().ok()?;
    record.read_usage(repeated)?;
    Some(record)
}

/// The record lines of a file that is UTF-8 text, parsed as [`record`] parses each (with
/// `content_value` false), by this crate's reader of a line (`line_json`: strings scanned
/// sixteen bytes at a time, a string with escapes copied once into a buffer kept over the
/// file's lines); a line it refuses goes to [`record`] of its text (serde_json's parse).
pub(crate) struct Lines<'t> {
    text: &'t str,
    /// The reader's buffer of strings with escapes.
    scratch: String,
}

impl<'t> Lines<'t> {
    pub fn new(text: &'t str) -> Self {
        Lines { text, scratch: String::new() }
    }

    /// [`record`] of `line`, the text of `range` of the file, with `content_value` false.
    pub fn record(&mut self, range: std::ops::Range<usize>, repeated: Option<&str>) -> Option<Box<Fields<'t>>> {
        let text: &'t str = self.text;
        let line = &text[range];
        let Ok(mut fields) = super::line_json::read(line, PickedRecord { content_value: false }, &mut self.scratch) else { return record(line, repeated, false) };
        fields.read_usage(repeated)?;
        if cfg!(debug_assertions) {
            let alone = record(line, repeated, false).unwrap_or_else(|| panic!("a line the line reader takes refused by serde_json: {line}"));
            assert_eq!(format!("{fields:?}"), format!("{alone:?}"), "the line reader's record differs from serde_json's: {line}");
        }
        Some(fields)
    }
}

/// The `Value` of a `message.usage` JSON text as a record line's parse builds it there: inside
/// two objects (the record and its message), which the parse's depth limit counts, as inside
/// two arrays here. An error where the parse in place fails.
pub(crate) fn usage_value(text: &str) -> Result<Value, serde_json::Error> {
    let [[value]] = serde_json::from_str::<[[Value; 1]; 1]>(&in_two_arrays(text))?;
    Ok(value)
}

/// A `message.usage` JSON text as the importer reads it: [`UsageRead::Read`] where it is an
/// object that reads as [`Usage`] field by field (`Usage::from_object` of its [`usage_value`]),
/// read without building that object; [`UsageRead::Value`] of its [`usage_value`] otherwise.
/// An error where [`usage_value`] fails.
pub(crate) fn usage_read(text: &str) -> Result<UsageRead, serde_json::Error> {
    match serde_json::from_str::<[[UsageFields; 1]; 1]>(&in_two_arrays(text)) {
        Ok([[UsageFields(usage)]]) => Ok(UsageRead::Read(usage)),
        // Not an object, a field `Usage::from_object` refuses, serde's raw value marker: built.
        Err(_) => usage_value(text).map(UsageRead::Value),
    }
}

/// `text` inside two arrays (`[[text]]`), which the parse's depth limit counts as it counts the
/// record and its message around a usage.
fn in_two_arrays(text: &str) -> String {
    let mut wrapped = String::with_capacity(text.len() + 4);
    wrapped.push_str("[[");
    wrapped.push_str(text);
    wrapped.push_str("]]");
    wrapped
}

/// What a message's `usage` gives the importer.
#[derive(Debug)]
pub(crate) enum UsageRead {
    /// The text [`record`] was given as repeated: not read.
    Repeated,
    /// An object that reads field by field (`Usage::from_object` of its value).
    Read(Usage),
    /// Any other value, as the whole parse builds it (the importer reads it as a whole record's).
    Value(Value),
}

impl UsageRead {
    /// The usage read (`Ok`) or the value built (`Err`); `None` for the repeated text, not read.
    pub fn into_usage(self) -> Option<Result<Usage, Value>> {
        match self {
            UsageRead::Repeated => None,
            UsageRead::Read(usage) => Some(Ok(usage)),
            UsageRead::Value(value) => Some(Err(value)),
        }
    }
}

/// A usage object read entry by entry into [`Usage::from_fields`]: each value built as the
/// `Value` parse builds it in place (the same checks and depth), no map of the whole object.
/// An error where that parse fails, the value is no object, serde's raw value marker is its
/// first key, or `Usage::from_object` would refuse it.
struct UsageFields(Usage);

impl<'de> Deserialize<'de> for UsageFields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UsageFieldsVisitor)
    }
}

struct UsageFieldsVisitor;

impl<'de> Visitor<'de> for UsageFieldsVisitor {
    type Value = UsageFields;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a usage object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut known: [Option<Value>; USAGE_FIELDS.len()] = Default::default();
        let mut extra = Map::new();
        let mut first = true;
        while let Some(key) = next_key(&mut map, &mut first)? {
            match USAGE_FIELDS.iter().position(|field| *field == key) {
                Some(slot) => known[slot] = Some(map.next_value()?),
                // A repeated key where it first stood, with its last value, as in the parse's map.
                None => {
                    extra.insert(key.into_owned(), map.next_value()?);
                }
            }
        }
        let usage = Usage::from_fields(known.each_ref().map(Option::as_ref), extra).ok_or_else(|| de::Error::custom("not a usage read field by field"))?;
        Ok(UsageFields(usage))
    }
}

/// The fields of [`RECORD_FIELDS`] the importer reads as values (moved into its events, or
/// read as objects): built as the whole parse builds them. Every other field that is a string
/// is kept as the string ([`Field::Str`]).
const VALUE_FIELDS: &[&str] = &["toolUseResult", "attachment", "data"];

/// A record's [`RECORD_FIELDS`], each in its slot (a `Value` as the whole parse builds it, or a
/// string borrowed from the line; `data` an object of [`DATA_FIELDS`]; `message` a [`Message`],
/// not in the slots): no key built, hashed or looked up in a map.
#[derive(Debug, Default)]
pub(crate) struct Fields<'t> {
    slots: [Option<Field<'t>>; RECORD_FIELDS.len()],
    /// The record's `message` (the last one). (Boxed, as the fields are: each is moved a few
    /// times on its way to the importer, a pointer where it would be the struct.)
    message: Option<Box<Message>>,
}

/// A top-level field: a string (of a field not in [`VALUE_FIELDS`]) as the line holds it,
/// borrowed where it has no escape; any other value as the whole parse builds it.
#[derive(Debug)]
pub(crate) enum Field<'t> {
    Str(Cow<'t, str>),
    Value(Value),
}

impl Field<'_> {
    /// The value the whole parse builds, taken.
    fn into_value(self) -> Value {
        match self {
            Field::Str(text) => Value::String(text.into_owned()),
            Field::Value(value) => value,
        }
    }

    /// The value the whole parse builds.
    fn to_value(&self) -> Value {
        match self {
            Field::Str(text) => Value::String(text.as_ref().to_owned()),
            Field::Value(value) => value.clone(),
        }
    }
}

impl<'de> Deserialize<'de> for Field<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(FieldVisitor)
    }
}

/// A string as [`Field::Str`]; any other value handed to `Value`'s own visitor through serde's
/// deserializers of what was visited (the same value, checks and depth as the whole parse).
struct FieldVisitor;

impl<'de> Visitor<'de> for FieldVisitor {
    type Value = Field<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Self::Value, E> {
        Ok(Field::Str(Cow::Borrowed(text)))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        Ok(Field::Str(Cow::Owned(text.to_owned())))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Self::Value, E> {
        Ok(Field::Str(Cow::Owned(text)))
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Self::Value, E> {
        Value::deserialize(value.into_deserializer()).map(Field::Value)
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Self::Value, E> {
        Value::deserialize(value.into_deserializer()).map(Field::Value)
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
        Value::deserialize(value.into_deserializer()).map(Field::Value)
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Self::Value, E> {
        Value::deserialize(value.into_deserializer()).map(Field::Value)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Value::deserialize(().into_deserializer()).map(Field::Value)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Value::deserialize(de::value::SeqAccessDeserializer::new(seq)).map(Field::Value)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        Value::deserialize(de::value::MapAccessDeserializer::new(map)).map(Field::Value)
    }
}

impl<'t> Fields<'t> {
    /// The slot of `key`, one of [`RECORD_FIELDS`] but `message`: reading another field of a
    /// picked record is a bug (the importer would read it as absent), so it panics.
    fn slot(key: &str) -> usize {
        match RECORD_FIELDS.iter().position(|field| *field == key) {
            Some(slot) if key != "message" => slot,
            Some(_) => panic!("the importer reads a picked record's message as a Value: read it through Fields::message"),
            None => panic!("the importer reads field `{key}` of a picked record: add it to picked::RECORD_FIELDS"),
        }
    }

    /// Whether the record has the field.
    pub fn has(&self, key: &str) -> bool {
        self.slots[Self::slot(key)].is_some()
    }

    /// A field that is a string.
    pub fn str(&self, key: &str) -> Option<&str> {
        match self.slots[Self::slot(key)].as_ref()? {
            Field::Str(text) => Some(text),
            Field::Value(value) => value.as_str(),
        }
    }

    /// A field that is a boolean.
    pub fn bool(&self, key: &str) -> Option<bool> {
        match self.slots[Self::slot(key)].as_ref()? {
            Field::Str(_) => None,
            Field::Value(value) => value.as_bool(),
        }
    }

    /// One of [`VALUE_FIELDS`] (another is a bug: it panics).
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self.slots[Self::value_slot(key)].as_ref()? {
            Field::Value(value) => Some(value),
            Field::Str(_) => unreachable!("a field of VALUE_FIELDS is kept as a value"),
        }
    }

    /// One of [`VALUE_FIELDS`], taken (another is a bug: it panics).
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        match self.slots[Self::value_slot(key)].take()? {
            Field::Value(value) => Some(value),
            Field::Str(_) => unreachable!("a field of VALUE_FIELDS is kept as a value"),
        }
    }

    fn value_slot(key: &str) -> usize {
        assert!(VALUE_FIELDS.contains(&key), "field `{key}` of a picked record read as a value: read it as a string or a boolean, or add it to picked::VALUE_FIELDS");
        Self::slot(key)
    }

    pub fn message(&self) -> Option<&Message> {
        self.message.as_deref()
    }

    pub fn message_mut(&mut self) -> Option<&mut Message> {
        self.message.as_deref_mut()
    }

    /// Reads the usage text the parse left (`usage_read`, unless it is `repeated`: [`record`]).
    /// `None` where it does not read, as the `Value` parse in place would fail.
    fn read_usage(&mut self, repeated: Option<&str>) -> Option<()> {
        debug_assert!(repeated.is_none_or(|text| usage_value(text).is_ok()), "a repeated usage that does not parse");
        let Some(message) = self.message.as_mut() else { return Some(()) };
        if let Some(text) = message.unread_usage.take() {
            let read = if repeated == Some(text.as_str()) { UsageRead::Repeated } else { usage_read(&text).ok()? };
            message.usage = Some((text, read));
        }
        Some(())
    }

    /// The JSON text of `message.usage` and what it gives, taken.
    pub fn take_usage(&mut self) -> Option<(String, UsageRead)> {
        self.message.as_mut()?.usage.take()
    }

    /// Whether `message.usage` was the repeated text, not read.
    #[cfg(test)]
    pub fn usage_repeated(&self) -> bool {
        matches!(self.message.as_ref().and_then(|message| message.usage.as_ref()), Some((_, UsageRead::Repeated)))
    }

    /// The fields as a map in [`RECORD_FIELDS`]' order, `message`'s in [`MESSAGE_FIELDS`]' order
    /// without its `usage` (for the debug checks and the tests).
    pub fn to_map(&self) -> Map<String, Value> {
        RECORD_FIELDS
            .iter()
            .zip(&self.slots)
            .filter_map(|(key, value)| {
                let value = match (*key, &self.message) {
                    ("message", Some(message)) => Value::Object(message.to_map()),
                    _ => value.as_ref()?.to_value(),
                };
                Some(((*key).to_owned(), value))
            })
            .collect()
    }
}

/// A record's `message`: the fields of [`MESSAGE_FIELDS`] (of a repeated key the last), the
/// usage as its text and what it gives, the content as [`Content`] where it was not asked for
/// as a value.
#[derive(Debug, Default)]
pub(crate) struct Message {
    /// Per field of [`MESSAGE_FIELDS`] but `usage` (whose slot stays empty), and `content`
    /// where it was read as [`Content`].
    slots: [Option<Value>; MESSAGE_FIELDS.len()],
    usage: Option<(String, UsageRead)>,
    /// The usage's text as the parse left it, before [`Fields::read_usage`] reads it.
    unread_usage: Option<String>,
    content: Option<Content>,
}

impl Message {
    /// The slot of `key`, one of [`MESSAGE_FIELDS`] but `usage` (read through
    /// [`Fields::take_usage`]); another is a bug, so it panics.
    fn slot(key: &str) -> usize {
        match MESSAGE_FIELDS.iter().position(|field| *field == key) {
            Some(slot) if key != "usage" => slot,
            // (Read as a value only where it was built as one: `record`'s `content_value`.)
            _ => panic!("the importer reads field `{key}` of a picked message: add it to picked::MESSAGE_FIELDS (usage: Fields::take_usage)"),
        }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        assert!(key != "content" || self.content.is_none(), "a picked message's content read as a value where it was read as blocks");
        self.slots[Self::slot(key)].as_ref()
    }

    pub fn take(&mut self, key: &str) -> Option<Value> {
        self.slots[Self::slot(key)].take()
    }

    /// An error where the usage text the parse left does not parse in place: a line with
    /// another usage or message after it fails as if that one were read ([`Fields::read_usage`]
    /// reads only the last; the repeated text given, if it is that one, parses).
    fn check_unread_usage(&self) -> Result<(), serde_json::Error> {
        self.unread_usage.as_deref().map_or(Ok(()), |text| usage_value(text).map(drop))
    }

    /// The content, taken: as read ([`Content`]), or the value built where it was asked for so.
    pub fn take_content(&mut self) -> Option<Content> {
        self.content.take().or_else(|| self.take("content").map(Content::Value))
    }

    fn to_map(&self) -> Map<String, Value> {
        MESSAGE_FIELDS.iter().zip(&self.slots).filter_map(|(key, value)| Some(((*key).to_owned(), value.clone()?))).collect()
    }
}

/// `whole` (a line's `Value` parse) as [`record`] reads it, as a map in [`RECORD_FIELDS`]'
/// order, `message`'s fields in [`MESSAGE_FIELDS`]' order: the same as [`Fields::to_map`] of
/// [`record`] of the line, but for the message's `usage`, which this keeps.
pub(crate) fn filtered_in_field_order(whole: &Map<String, Value>) -> Map<String, Value> {
    let mut filtered = filtered(whole);
    if let Some(Value::Object(message)) = filtered.get_mut("message") {
        *message = MESSAGE_FIELDS.iter().filter_map(|key| Some(((*key).to_owned(), message.get(*key)?.clone()))).collect();
    }
    RECORD_FIELDS.iter().filter_map(|key| Some(((*key).to_owned(), filtered.get(*key)?.clone()))).collect()
}

/// Panics where `fields`, [`record`] of a line given `repeated`, is not what the line's whole
/// parse `whole` gives the importer: the same fields ([`filtered_in_field_order`]), and a usage
/// that is the whole one's (as a repeated text, the repeated one's value; as read, what
/// `Usage::from_object` reads of it; as built, the same value). `file` names the line's file.
pub(crate) fn assert_same_as_whole(fields: &Fields<'_>, whole: &Map<String, Value>, repeated: Option<&str>, file: &str) {
    let mut filtered = filtered_in_field_order(whole);
    let usage = filtered.get_mut("message").and_then(Value::as_object_mut).and_then(|message| message.shift_remove("usage"));
    if let Some(content) = fields.message.as_ref().and_then(|message| message.content.as_ref()) {
        let whole = filtered.get_mut("message").and_then(Value::as_object_mut).and_then(|message| message.shift_remove("content"));
        assert!(whole.is_some_and(|whole| content.same_as(&whole)), "{file}: a message's content read differs from the whole parse's");
    }
    match fields.message.as_ref().and_then(|message| message.usage.as_ref()) {
        None => assert!(usage.is_none(), "{file}: a usage not read"),
        Some((_, UsageRead::Repeated)) => {
            assert_eq!(usage, repeated.and_then(|text| usage_value(text).ok()), "{file}: a usage left out as repeated differs")
        }
        Some((text, UsageRead::Read(read))) => {
            let Some(Value::Object(object)) = usage else { panic!("{file}: a usage read field by field is no object in the whole parse: {text}") };
            let whole = Usage::from_object(object).unwrap_or_else(|_| panic!("{file}: a usage read field by field does not read whole: {text}"));
            // (`extra`'s equality ignores its order; its text does not.)
            assert_eq!(serde_json::to_string(read).ok(), serde_json::to_string(&whole).ok(), "{file}: a usage read field by field differs: {text}");
        }
        Some((text, UsageRead::Value(value))) => {
            assert!(usage.as_ref().is_some_and(|usage| same(usage, value)), "{file}: a usage built differs: {text}")
        }
    }
    assert!(same_in_order(&fields.to_map(), &filtered), "{file}: the picked record {fields:?} is not the whole one's fields");
}

/// The top-level object of a record line, into [`Fields`] (its usage not read yet:
/// [`Fields::read_usage`]).
struct PickedRecord {
    content_value: bool,
}

impl<'de> DeserializeSeed<'de> for PickedRecord {
    type Value = Box<Fields<'de>>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PickedRecord {
    type Value = Box<Fields<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        // (Boxed: a few kilobytes, moved through the parse and the importer as a pointer.)
        let mut fields = Box::<Fields>::default();
        let mut first = true;
        while let Some(key) = next_key(&mut map, &mut first)? {
            match RECORD_FIELDS.iter().position(|field| *field == key) {
                // A repeated key: the last value wins, as in the whole parse's map.
                Some(_) if key == "message" => {
                    if let Some(earlier) = &fields.message {
                        earlier.check_unread_usage().map_err(de::Error::custom)?;
                    }
                    fields.message = Some(map.next_value_seed(PickedMessage { content_value: self.content_value })?);
                }
                Some(slot) => match nested_fields(&key) {
                    Some(fields_of) => fields.slots[slot] = Some(Field::Value(Value::Object(map.next_value_seed(Picked { fields: fields_of })?))),
                    None if VALUE_FIELDS.contains(&key.as_ref()) => fields.slots[slot] = Some(Field::Value(map.next_value()?)),
                    None => fields.slots[slot] = Some(map.next_value::<Field>()?),
                },
                None => {
                    map.next_value::<Checked>()?;
                }
            }
        }
        Ok(fields)
    }
}

/// `whole` (a line's `Value` parse) with only the fields [`record`] builds, in the line's
/// order (and `message.usage`, which it reads apart). For the debug checks and the tests.
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
    a.len() == b.len() && a.iter().zip(b).all(|((ka, va), (kb, vb))| ka == kb && same(va, vb))
}

/// Whether two values are the same, the entries of their maps in the same order.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => same_in_order(a, b),
        (Value::Array(a), Value::Array(b)) => a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same(a, b)),
        _ => a == b,
    }
}

/// An object, building only the entries of `fields`.
struct Picked {
    fields: &'static [&'static str],
}

impl<'de> DeserializeSeed<'de> for Picked {
    type Value = Map<String, Value>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Picked {
    type Value = Map<String, Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut picked = Map::new();
        let mut first = true;
        while let Some(key) = next_key(&mut map, &mut first)? {
            if self.fields.contains(&key.as_ref()) {
                let value: Value = map.next_value()?;
                picked.insert(key.into_owned(), value);
            } else {
                map.next_value::<Checked>()?;
            }
        }
        Ok(picked)
    }
}

/// A record's `message` object into [`Message`]: the fields of [`MESSAGE_FIELDS`] built, the
/// others read without building; its `usage` kept as its text, for [`Fields::read_usage`].
struct PickedMessage {
    content_value: bool,
}

impl<'de> DeserializeSeed<'de> for PickedMessage {
    type Value = Box<Message>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PickedMessage {
    type Value = Box<Message>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut message = Box::<Message>::default();
        let mut first = true;
        while let Some(key) = next_key(&mut map, &mut first)? {
            match MESSAGE_FIELDS.iter().position(|field| *field == key) {
                Some(_) if key == "usage" => {
                    // Read as text (serde_json's raw value: the same syntax checks, no depth
                    // limit, which `usage_read` applies), borrowed from the line.
                    let text = map.next_value::<&'de serde_json::value::RawValue>()?.get();
                    // Of two usages the last wins.
                    message.check_unread_usage().map_err(de::Error::custom)?;
                    message.unread_usage = Some(text.to_owned());
                }
                Some(_) if key == "content" && !self.content_value => message.content = Some(map.next_value_seed(Shaped::<ContentRead>::new())?.0),
                Some(slot) => message.slots[slot] = Some(map.next_value()?),
                None => {
                    map.next_value::<Checked>()?;
                }
            }
        }
        Ok(message)
    }
}

/// A message's `content` as the importer reads it: an array's items each read as a content
/// block (`ContentBlock::from_value` of the item's value, the object's entries read without a
/// map), any other value built.
#[derive(Debug)]
pub(crate) enum Content {
    Items(Vec<Result<ContentBlock, ItemError>>),
    Value(Value),
}

/// An item of a content array that is no content block: `ContentBlock::from_value`'s message,
/// and the item's `text` where it is a string (the text of a compaction's summary counts it).
#[derive(Debug, PartialEq)]
pub(crate) struct ItemError {
    pub message: String,
    pub text: Option<String>,
}

impl Content {
    /// The text of the content: a string, or the `text` strings of an array's items joined by
    /// line breaks (a compaction's summary).
    pub fn text(&self) -> String {
        match self {
            Content::Value(Value::String(text)) => text.clone(),
            Content::Value(Value::Array(items)) => items.iter().filter_map(|b| b.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n"),
            Content::Value(_) => String::new(),
            Content::Items(items) => items
                .iter()
                .filter_map(|item| match item {
                    Ok(block) => block_text(block),
                    Err(error) => error.text.as_deref(),
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// Whether this is what the importer reads of `whole`, the content's value: the same
    /// blocks (by their JSON text: key order counts), the same errors, the same text.
    fn same_as(&self, whole: &Value) -> bool {
        let Content::Items(items) = self else { return matches!(self, Content::Value(value) if same(value, whole)) };
        let Value::Array(values) = whole else { return false };
        let text = Content::Value(whole.clone()).text();
        let read = |item: &Value| ContentBlock::from_value(item.clone());
        items.len() == values.len()
            && items.iter().zip(values).all(|(item, value)| match (item, read(value)) {
                (Ok(block), Ok(whole)) => serde_json::to_string(block).ok() == serde_json::to_string(&whole).ok(),
                (Err(error), Err(message)) => error.message == message,
                _ => false,
            })
            && self.text() == text
    }
}

/// The `text` of an item read as `block`, where it was a string: a text block's text, or an
/// entry the block kept.
fn block_text(block: &ContentBlock) -> Option<&str> {
    let extra = match block {
        ContentBlock::Text { text, .. } => return Some(text),
        ContentBlock::Other(value) => return value.get("text").and_then(Value::as_str),
        ContentBlock::Image(inner) | ContentBlock::Document(inner) => &inner.extra,
        ContentBlock::ToolUse { extra, .. }
        | ContentBlock::ServerToolUse { extra, .. }
        | ContentBlock::ToolResult { extra, .. }
        | ContentBlock::FinalToolResult { extra, .. }
        | ContentBlock::Thinking { extra, .. }
        | ContentBlock::RedactedThinking { extra, .. }
        | ContentBlock::ToolReference { extra, .. } => extra,
    };
    extra.get("text").and_then(Value::as_str)
}

/// How [`Shaped`] reads a value: an array or an object its own way where it has one, any other
/// value as [`FieldVisitor`] reads it (a string as its text, the rest as `Value`'s visitor
/// builds it), then handed to `other`.
trait Shape<'de> {
    type Out;

    fn other<E: de::Error>(field: Field<'de>) -> Result<Self::Out, E>;

    fn seq<A: SeqAccess<'de>>(seq: A) -> Result<Self::Out, A::Error> {
        Self::other(FieldVisitor.visit_seq(seq)?)
    }

    fn map<A: MapAccess<'de>>(map: A) -> Result<Self::Out, A::Error> {
        Self::other(FieldVisitor.visit_map(map)?)
    }
}

/// A value read as its [`Shape`] says.
struct Shaped<S>(std::marker::PhantomData<S>);

impl<S> Shaped<S> {
    fn new() -> Self {
        Shaped(std::marker::PhantomData)
    }
}

impl<'de, S: Shape<'de>> DeserializeSeed<'de> for Shaped<S> {
    type Value = S::Out;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Out, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de, S: Shape<'de>> Visitor<'de> for Shaped<S> {
    type Value = S::Out;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<S::Out, E> {
        S::other(FieldVisitor.visit_bool(value)?)
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<S::Out, E> {
        S::other(FieldVisitor.visit_i64(value)?)
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<S::Out, E> {
        S::other(FieldVisitor.visit_u64(value)?)
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<S::Out, E> {
        S::other(FieldVisitor.visit_f64(value)?)
    }

    fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<S::Out, E> {
        S::other(FieldVisitor.visit_borrowed_str(text)?)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<S::Out, E> {
        S::other(FieldVisitor.visit_str(text)?)
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<S::Out, E> {
        S::other(FieldVisitor.visit_string(text)?)
    }

    fn visit_unit<E: de::Error>(self) -> Result<S::Out, E> {
        S::other(FieldVisitor.visit_unit()?)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<S::Out, A::Error> {
        S::seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<S::Out, A::Error> {
        S::map(map)
    }
}

/// A message's `content` read as [`Content`]: an array's items each an [`Item`], any other value
/// built.
struct ContentRead(Content);

impl<'de> Shape<'de> for ContentRead {
    type Out = ContentRead;

    fn other<E: de::Error>(field: Field<'de>) -> Result<ContentRead, E> {
        Ok(ContentRead(Content::Value(field.into_value())))
    }

    fn seq<A: SeqAccess<'de>>(mut seq: A) -> Result<ContentRead, A::Error> {
        let mut items = Vec::new();
        while let Some(Item(item)) = seq.next_element_seed(Shaped::<Item>::new())? {
            items.push(item);
        }
        Ok(ContentRead(Content::Items(items)))
    }
}

/// An item of a content array, read as a content block: an object's entries into
/// [`ContentBlock::from_entries`]; any other value built and given to `ContentBlock::from_value`
/// (which refuses it, naming what it is).
struct Item(Result<ContentBlock, ItemError>);

impl<'de> Shape<'de> for Item {
    type Out = Item;

    fn other<E: de::Error>(field: Field<'de>) -> Result<Item, E> {
        let value = field.into_value();
        let text = value.get("text").and_then(Value::as_str).map(str::to_owned);
        Ok(Item(ContentBlock::from_value(value).map_err(|message| ItemError { message, text })))
    }

    fn map<A: MapAccess<'de>>(mut map: A) -> Result<Item, A::Error> {
        // (A block has four entries or fewer, but for the rare ones.)
        let mut entries = Entries(Vec::with_capacity(4));
        let mut first = true;
        while let Some(key) = next_key(&mut map, &mut first)? {
            let value: Value = map.next_value()?;
            // A repeated key where it first stood, with its last value, as in the parse's map.
            match entries.0.iter_mut().find(|(known, _)| *known == key) {
                Some((_, known)) => *known = value,
                None => entries.0.push((key, value)),
            }
        }
        // The item's text, for a block refused: `from_entries` moves a text block's text out
        // before it reads the marker that can refuse it, and leaves any other kind's.
        let refusable_text = entries.get("type").and_then(Value::as_str) != Some("text") || entries.get("cache_control").is_some_and(|marker| !marker.is_null());
        let text = if refusable_text { entries.get("text").and_then(Value::as_str).map(str::to_owned) } else { None };
        Ok(Item(ContentBlock::from_entries(entries).map_err(|message| ItemError { message, text })))
    }
}

/// A content block's entries as the object's parse leaves them (each key once, where it first
/// stood, with its last value), in a list: no key hashed, no map built but of the entries a
/// block keeps as they are.
struct Entries<'de>(Vec<(Cow<'de, str>, Value)>);

impl BlockEntries for Entries<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().find(|(known, _)| known == key).map(|(_, value)| value)
    }

    fn remove(&mut self, key: &str) -> Option<Value> {
        let index = self.0.iter().position(|(known, _)| known == key)?;
        Some(self.0.swap_remove(index).1)
    }

    fn into_map(self) -> Map<String, Value> {
        self.0.into_iter().map(|(key, value)| (key.into_owned(), value)).collect()
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
        match deserializer.deserialize_str(FieldVisitor)? {
            Field::Str(key) => Ok(Key(key)),
            Field::Value(value) => Err(de::Error::custom(format_args!("a key that is no string: {value}"))),
        }
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
        check_with(text, false);
        check_with(text, true);
    }

    /// [`check`] with `message.content` read as [`Content`] or built (`content_value`).
    fn check_with(text: &str, content_value: bool) {
        let whole = serde_json::from_str::<Value>(text);
        match record(text, None, content_value) {
            Some(mut picked) => {
                let Ok(Value::Object(whole)) = whole else { panic!("picked a line the Value parse refuses: {text}") };
                assert_same_as_whole(&picked, &whole, None, text);
                // Given its usage's text as repeated, the line parses the same but for the usage
                // not read, which is that text's value.
                if let Some((usage, read)) = picked.take_usage() {
                    assert!(!matches!(read, UsageRead::Repeated), "{text}");
                    let again = record(text, Some(&usage), content_value).unwrap_or_else(|| panic!("a usage given as repeated refuses the line: {text}"));
                    assert!(again.usage_repeated(), "{text}");
                    assert_same_as_whole(&again, &whole, Some(&usage), text);
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
            prop_assert!(record(&text, None, false).is_some(), "{}", text);
            check(&text);
        }
    }

    /// A content block's JSON text: keys of every modelled kind (repeated ones too, the marker,
    /// keys no kind reads), values of every kind.
    fn block() -> BoxedStrategy<String> {
        let kind = prop_oneof![
            prop::sample::select(&["text", "tool_use", "server_tool_use", "tool_result", "thinking", "redacted_thinking", "tool_reference", "image", "document", "advisor_tool_result"][..]).prop_map(|k| format!("\"{k}\"")),
            json_of(0, false),
        ];
        let key = prop::sample::select(&["text", "id", "name", "input", "tool_use_id", "content", "is_error", "cache_control", "signature", "thinking", "data", "tool_name", "source", "caller", "type", "citations"][..]);
        let value = prop_oneof![
            4 => json_of(2, false),
            1 => Just("{\"type\":\"ephemeral\",\"ttl\":\"1h\"}".to_owned()),
            1 => Just("[{\"type\":\"text\",\"text\":\"r\"},{\"type\":\"image\",\"source\":{}}]".to_owned()),
            1 => json(1),
        ];
        (kind, prop::collection::vec((key, value), 0..6), 0..3usize)
            .prop_map(|(kind, entries, at)| {
                let mut entries: Vec<String> = entries.into_iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                entries.insert(at.min(entries.len()), format!("\"type\":{kind}"));
                format!("{{{}}}", entries.join(","))
            })
            .boxed()
    }

    proptest! {
        #[test]
        fn picked_content_is_the_whole_content_read(
            items in prop::collection::vec(prop_oneof![6 => block(), 1 => json_of(1, false)], 0..5),
            summary in any::<bool>(),
        ) {
            let text = format!(r#"{{"type":"user","isCompactSummary":{summary},"message":{{"role":"user","content":[{}]}}}}"#, items.join(","));
            let fields = record(&text, None, false);
            prop_assert!(fields.as_ref().is_some_and(|f| matches!(f.message().and_then(|m| m.content.as_ref()), Some(Content::Items(_)))) || text.contains(RAW_VALUE_TOKEN) || serde_json::from_str::<Value>(&text).is_err(), "{}", text);
            check(&text);
        }
    }

    /// Each line of `text` (the non-blank ones, but those in `apart`) through [`Lines`], and
    /// through [`record`] alone: the same record, or none from both. The lines in `apart` are
    /// read apart (as the importer reads a line whose content it builds as a value).
    fn check_lines(text: &str, apart: &[usize]) {
        let mut lines = Lines::new(text);
        for line in crate::recording::format::SliceLines::new(text.as_bytes()) {
            let at = line.bytes.as_ptr() as usize - text.as_ptr() as usize;
            let alone = &text[at..at + line.bytes.len()];
            if line.is_blank() || apart.contains(&line.number) {
                continue;
            }
            let usage = r#"{"output_tokens":2}"#;
            for repeated in [None, Some(usage)] {
                let streamed = lines.record(at..at + alone.len(), repeated);
                // (A second read of a line: the stream starts again there.)
                assert_eq!(format!("{streamed:?}"), format!("{:?}", record(alone, repeated, false)), "line {} of {text:?}", line.number);
            }
        }
    }

    proptest! {
        #[test]
        fn lines_read_as_each_line_alone(
            items in prop::collection::vec((prop_oneof![4 => json_of(3, false), 2 => json(2), 1 => Just(String::new()), 1 => Just(" \x0c ".to_owned())], prop_oneof![Just("\n"), Just("\r\n"), Just(" \n"), Just("\n\n")]), 0..8),
            apart in prop::collection::vec(1..12usize, 0..3),
        ) {
            let text: String = items.into_iter().map(|(line, end)| line + end).collect();
            check_lines(&text, &apart);
        }
    }

    /// A string's JSON text of pieces that exercise the line reader's scan and unescaping: long
    /// runs (its sixteen-byte steps), every escape, multi-byte characters, control characters.
    fn string_text() -> impl Strategy<Value = String> {
        let piece = prop::sample::select(&[
            "a", "é", "字", "\\n", "\\\"", "\\\\", "\\/", "\\b\\f\\r\\t", "\\u00e9", "\\u0000", "\\uD83D\\uDE00", "\\ud800", "\\udc00x",
            "\\ud800\\u0041", "\\u12", "\\x", "\t", "0123456789abcdefghij", " spaces and words, seventeen+ ",
        ][..]);
        prop::collection::vec(piece, 0..12).prop_map(|pieces| format!("\"{}\"", pieces.concat()))
    }

    /// The line reader's value of `text` is serde_json's, or it refuses the text; its record is
    /// [`record`]'s (serde_json's), or it refuses it.
    fn check_reader(text: &str) -> bool {
        let mut scratch = String::new();
        let value = super::super::line_json::read(text, std::marker::PhantomData::<Value>, &mut scratch);
        if let Ok(value) = &value {
            let whole = serde_json::from_str::<Value>(text).unwrap_or_else(|error| panic!("the line reader took what serde_json refuses ({error}): {text}"));
            assert!(same(value, &whole), "{text}");
            assert_eq!(serde_json::to_string(value).ok(), serde_json::to_string(&whole).ok(), "{text}");
        }
        if let Ok(mut fields) = super::super::line_json::read(text, PickedRecord { content_value: false }, &mut scratch) {
            let alone = record(text, None, false);
            match fields.read_usage(None) {
                Some(()) => assert_eq!(format!("{fields:?}"), format!("{:?}", alone.expect("serde_json's record")), "{text}"),
                None => assert!(alone.is_none(), "{text}"),
            }
        }
        value.is_ok()
    }

    proptest! {
        #[test]
        fn line_reader_reads_as_serde_json(text in json(4)) {
            check_reader(&text);
        }

        #[test]
        fn line_reader_takes_valid_json(text in json_of(4, false), string in string_text(), prefix in "[ \t\r\n]{0,2}") {
            // (Valid JSON of the usual shapes: read, not refused.)
            prop_assert!(check_reader(&format!("{prefix}{text}{prefix}")), "{}", text);
            let line = format!(r#"{{"type":"user","message":{{"content":[{{"type":"text","text":{string}}}],"usage":{{"output_tokens":1}}}},"uuid":{string},"x":[{string}],{string}:{text}}}"#);
            check_reader(&line);
            check_reader(&string);
        }
    }

    #[test]
    fn line_reader_edges() {
        for (text, read) in [
            (r#""a\u00e9\ud83d\ude00\n\"b""#, true),
            (r#"{"a":[1,-2,3.5e2,-0,0,18446744073709551615,18446744073709551616,1e999]}"#, false),
            (r#"{"a":[1,-2,3.5e2,-0,0,18446744073709551615,123456789012345678901]}"#, true),
            ("[01]", false),
            ("[1,]", false),
            (r#"{"a":1,}"#, false),
            (r#"{"a" 1}"#, false),
            ("nul", false),
            ("[true,false,null]", true),
            (r#""\ud800""#, false),
            (r#""\udc00""#, false),
            ("\"tab\there\"", false),
            (r#"{"$serde_json::private::RawValue":"{}"}"#, false),
            ("", false),
            (" 7 ", true),
            ("7 x", false),
        ] {
            assert_eq!(check_reader(text), read, "{text}");
        }
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(check_reader(&deep(99)));
        assert!(!check_reader(&deep(100)));
        // A usage read as its text (serde_json's raw value): the text as serde_json gives it.
        let line = r#"{"message":{"usage": {"output_tokens" : 2 , "x":[1.5e3, "\u00e9"]} ,"id":"m"},"type":"assistant"}"#;
        assert!(check_reader(line));
        let mut scratch = String::new();
        let mut fields = super::super::line_json::read(line, PickedRecord { content_value: false }, &mut scratch).expect("read");
        fields.read_usage(None).expect("a usage");
        assert_eq!(fields.take_usage().map(|(text, _)| text).as_deref(), Some(r#"{"output_tokens" : 2 , "x":[1.5e3, "\u00e9"]}"#));
    }

    #[test]
    fn lines_edges() {
        for text in [
            "{\"type\":\"user\",\"message\":{\"usage\":{\"output_tokens\":2},\"content\":\"a\\nb\"}}\n{\"type\":\"x\"}\n",
            // Two values on a line; a value over two lines; a line cut short; trailing junk.
            "{\"a\":1} {\"b\":2}\n{\"c\":3}\n",
            "{\"a\":\n1}\n{\"c\":3}",
            "{\"a\":1}\n{\"b\":\n{\"c\":\"\\u00e9\"}\n",
            "{\"a\":1}x\n{\"c\":3}\n[1]\n{\"d\":{\"e\":[\"\\t\"]}}\n",
            "\u{feff}{\"a\":1}\n\n  \n{\"b\":2}\r\n{\"c\":3}",
            // Blank lines the importer skips that JSON does not take as whitespace.
            "{\"a\":1}\n\x0c\n{\"b\":2}\n",
            // Two usages in a message, the first one the repeated text.
            "{\"message\":{\"usage\":{\"output_tokens\":2},\"usage\":{\"a\":1}}}\n{\"message\":{\"usage\":{\"output_tokens\":2}}}\n",
        ] {
            check_lines(text, &[]);
            check_lines(text, &[2]);
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
            // Content blocks: entries a block keeps, in the order its removals leave them; a key
            // repeated; blocks refused (the text of a compaction's summary counts theirs).
            r#"{"type":"user","message":{"content":[{"type":"tool_use","caller":{"a":1},"id":"t","z":[],"name":"n","input":{},"y":2}]}}"#,
            r#"{"type":"user","message":{"content":[{"id":"t","type":"tool_use","name":"n","id":"u","input":{"k":"v"},"type":"tool_use"}]}}"#,
            r#"{"type":"user","isCompactSummary":true,"message":{"content":[{"type":"text","text":"a","cache_control":{"type":"nope"}},{"type":"tool_use","text":"b"},{"type":5,"text":"c"},7,{"type":"other","text":"d"},{"type":"image","text":"e","source":{}}]}}"#,
            r#"{"type":"user","message":{"content":[{"tool_use_id":"t","type":"tool_result","content":[{"type":"text","text":"r"},{"type":"image"}],"is_error":true,"extra":null}]}}"#,
            r#"{"type":"user","message":{"content":[{"$serde_json::private::RawValue":"{}"}]}}"#,
            r#"{"type":"user","message":{"content":"prompt"}}"#,
            r#"{"type":"user","message":{"content":{"a":[1]}}}"#,
            "",
        ] {
            check(text);
        }
        // A usage read as text: given as the repeated one (byte for byte), it is not built; two
        // usages in a message go to the whole parse.
        let chunk = r#"{"message":{"id":"m","usage":{"input_tokens":1, "output_tokens":2},"content":[]},"type":"assistant"}"#;
        let usage = r#"{"input_tokens":1, "output_tokens":2}"#;
        let mut built = record(chunk, Some(r#"{"input_tokens":1,"output_tokens":2}"#), false).expect("a record");
        assert!(matches!(built.take_usage(), Some((text, UsageRead::Read(read))) if text == usage && read.output_tokens == 2 && read.input_tokens == 1));
        let mut left_out = record(chunk, Some(usage), false).expect("a record");
        assert!(left_out.usage_repeated());
        assert!(matches!(left_out.take_usage(), Some((text, UsageRead::Repeated)) if text == usage));
        // Of two usages the last wins; not read where it is the repeated one.
        let two = r#"{"message":{"usage":{},"id":"m","usage":{"a":1}}}"#;
        let mut built = record(two, Some("{}"), false).expect("a record");
        assert!(matches!(built.take_usage(), Some((text, UsageRead::Read(read))) if text == r#"{"a":1}"# && read.extra.get("a") == Some(&Value::from(1))));
        assert_eq!(serde_json::to_string(&built.to_map()).unwrap(), r#"{"message":{"id":"m"}}"#);
        let mut left_out = record(two, Some(r#"{"a":1}"#), false).expect("a record");
        assert!(matches!(left_out.take_usage(), Some((text, UsageRead::Repeated)) if text == r#"{"a":1}"#));
        let deep = format!("{}{}", "[".repeat(126), "]".repeat(126));
        assert!(usage_value(&deep).is_err() && serde_json::from_str::<Value>(&deep).is_ok());
        check(&format!(r#"{{"message":{{"usage":{deep}}}}}"#));
        // One that does not parse in place fails the line where another usage or message
        // follows, as the whole parse fails.
        check(&format!(r#"{{"message":{{"usage":{deep},"usage":{{}}}}}}"#));
        check(&format!(r#"{{"message":{{"usage":{deep}}},"message":{{}}}}"#));
        assert!(record(&format!(r#"{{"message":{{"usage":{deep}}},"message":{{}}}}"#), None, false).is_none());
        assert!(record(r#"{"slug":"s","uuid":"u"}"#, None, false).is_some_and(|r| r.to_map().len() == 1 && r.str("uuid") == Some("u")));
        // A reply's envelope is not built; what the importer reads of it is.
        let reply = r#"{"message":{"id":"m","role":"assistant","model":"x","stop_sequence":null,"content":[],"usage":{"output_tokens":1}}}"#;
        let built = record(reply, None, true).expect("a record");
        assert_eq!(serde_json::to_string(&built.to_map()).unwrap(), r#"{"message":{"content":[],"model":"x","id":"m"}}"#);
        // A usage read field by field is what `Usage::from_object` reads of its value, its other
        // entries in their order (a repeated one where it first stood); one that does not read
        // so is built, for the importer to read as a whole record's.
        for (text, read) in [
            (r#"{"b":1,"output_tokens":3,"a":{"x":[1]},"b":2,"cache_creation":{"ephemeral_1h_input_tokens":4}}"#, true),
            (r#"{"output_tokens":3,"output_tokens":null}"#, false),
            (r#"{"cache_read_input_tokens":null,"input_tokens":1.5}"#, false),
            (r#"{"cache_creation":{"ephemeral_1h_input_tokens":-1}}"#, false),
            (r#"{"cache_creation_input_tokens":null,"cache_creation":null}"#, true),
            (r#"{"$serde_json::private::RawValue":"{}"}"#, false),
            ("null", false),
            ("[1]", false),
            ("7", false),
        ] {
            let line = format!(r#"{{"message":{{"usage":{text}}}}}"#);
            let fields = record(&line, None, false).expect("a record");
            let Ok(Value::Object(whole)) = serde_json::from_str::<Value>(&line) else { panic!("{line}") };
            assert_same_as_whole(&fields, &whole, None, &line);
            assert_eq!(matches!(fields.message().and_then(|m| m.usage.as_ref()), Some((_, UsageRead::Read(_)))), read, "{text}");
        }
    }
}
