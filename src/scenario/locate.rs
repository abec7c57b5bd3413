//! Finds the line and column of a field path in YAML text.
//!
//! serde_norway has no spans on successfully parsed values, but it stamps the position of the
//! node being read onto any error a visitor raises there. So to locate `script[3].tool_output`
//! we deserialize the text again, walking down that path while skipping everything else, and
//! raise an error on arrival; the error's location is the node's.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::check::Seg;

/// 1-based `(line, column)` of the node at `path`, or of its deepest existing ancestor.
pub(crate) fn locate(text: &str, path: &[Seg]) -> Option<(usize, usize)> {
    (0..=path.len()).rev().find_map(|len| {
        let err = Probe { path: &path[..len] }.deserialize(serde_norway::Deserializer::from_str(text)).err()?;
        if err.to_string().contains(ARRIVED) {
            err.location().map(|l| (l.line(), l.column()))
        } else {
            None
        }
    })
}

const ARRIVED: &str = "ctxsim-locate-arrived";

struct Probe<'a> {
    path: &'a [Seg],
}

impl<'de> DeserializeSeed<'de> for Probe<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Probe<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.leaf()
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.leaf()
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.leaf()
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.leaf()
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.leaf()
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.leaf()
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.leaf()
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some((first, rest)) = self.path.split_first() else {
            return Err(de::Error::custom(ARRIVED));
        };
        let Seg::Index(target) = first else { return Ok(()) };
        for _ in 0..*target {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Ok(());
            }
        }
        seq.next_element_seed(Probe { path: rest })?;
        // Not found further down (the error would have returned): drain so the parser is happy.
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((first, rest)) = self.path.split_first() else {
            return Err(de::Error::custom(ARRIVED));
        };
        let Seg::Key(target) = first else { return Ok(()) };
        while let Some(key) = map.next_key::<serde_norway::Value>()? {
            let matches = match &key {
                serde_norway::Value::String(s) => s == target,
                serde_norway::Value::Number(n) => n.to_string() == *target,
                serde_norway::Value::Bool(b) => b.to_string() == *target,
                _ => false,
            };
            if matches {
                map.next_value_seed(Probe { path: rest })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

impl Probe<'_> {
    fn leaf<E: de::Error>(&self) -> Result<(), E> {
        if self.path.is_empty() { Err(E::custom(ARRIVED)) } else { Ok(()) }
    }
}
