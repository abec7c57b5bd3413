//! Scalar value types of the schema whose parsing can fail (timestamps, time zones, env values).
//! Each is deserialized through a visitor so errors keep the YAML position.

use std::fmt;

use jiff::Timestamp;
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use crate::world::parse_time_zone;

/// An RFC 3339 timestamp such as `2026-03-01T09:00:00Z`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rfc3339(pub Timestamp);

impl Rfc3339 {
    pub fn unix_ms(&self) -> i64 {
        self.0.as_millisecond()
    }
}

impl<'de> Deserialize<'de> for Rfc3339 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Rfc3339;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an RFC 3339 timestamp such as `2026-03-01T09:00:00Z`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Rfc3339, E> {
                v.parse::<Timestamp>()
                    .map(Rfc3339)
                    .map_err(|e| E::custom(format!("invalid RFC 3339 timestamp `{v}` (e.g. `2026-03-01T09:00:00Z`): {e}")))
            }
        }
        deserializer.deserialize_str(V)
    }
}

/// A validated time zone name: `UTC`, `+05:30`, or an IANA name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeZoneName(pub String);

impl Default for TimeZoneName {
    fn default() -> Self {
        TimeZoneName("UTC".to_owned())
    }
}

impl<'de> Deserialize<'de> for TimeZoneName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = TimeZoneName;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a time zone: `UTC`, an offset like `+02:00`, or an IANA name like `Europe/Paris`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<TimeZoneName, E> {
                parse_time_zone(v).map(|_| TimeZoneName(v.to_owned())).map_err(E::custom)
            }
        }
        deserializer.deserialize_str(V)
    }
}

/// An environment variable value: YAML strings, numbers and booleans all become strings, so
/// `DISABLE_AUTO_COMPACT: 1` works as it would in a shell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvValue(pub String);

impl<'de> Deserialize<'de> for EnvValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = EnvValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, number or boolean")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<EnvValue, E> {
                Ok(EnvValue(v.to_owned()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<EnvValue, E> {
                Ok(EnvValue(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<EnvValue, E> {
                Ok(EnvValue(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<EnvValue, E> {
                Ok(EnvValue(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<EnvValue, E> {
                Ok(EnvValue(v.to_string()))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// An initial file of `world.files`: its contents as a string, or `{contents, mtime}` when the
/// scenario needs a modification time (the client orders post-compaction restores by the time a
/// file had when it was read). Without `mtime` the file dates from the clock's start.
#[derive(Debug, Clone, PartialEq)]
pub struct FileSpec {
    pub contents: String,
    pub mtime: Option<Rfc3339>,
}

impl From<String> for FileSpec {
    fn from(contents: String) -> Self {
        FileSpec { contents, mtime: None }
    }
}

impl<'de> Deserialize<'de> for FileSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Full {
            contents: String,
            #[serde(default)]
            mtime: Option<Rfc3339>,
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FileSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("the file's contents, or a map with `contents` and `mtime`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<FileSpec, E> {
                Ok(FileSpec::from(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<FileSpec, E> {
                Ok(FileSpec::from(v))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<FileSpec, A::Error> {
                let full = Full::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(FileSpec { contents: full.contents, mtime: full.mtime })
            }
        }
        deserializer.deserialize_any(V)
    }
}
