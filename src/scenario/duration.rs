//! Durations in scenarios: a number of milliseconds, or a string of `<integer><unit>` parts
//! with units `ms`, `s`, `m`, `h`, `d` (`90s`, `10m`, `1h30m`, `250ms`).

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

/// A non-negative duration in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct DurationMs(pub u64);

/// Parses `90s`, `10m`, `2h`, `1h30m`, `250ms`, `1d` or a bare integer (milliseconds).
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let bad = |why: &str| format!("invalid duration `{text}`: {why}; expected milliseconds or e.g. `90s`, `10m`, `2h`, `1h30m`");
    if text.starts_with('-') {
        return Err(bad("durations must not be negative"));
    }
    if text.is_empty() {
        return Err(bad("empty"));
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse::<u64>().map_err(|_| bad("too large"));
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad("each part must start with a number"));
        }
        let number: u64 = rest[..digits].parse().map_err(|_| bad("too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let scale = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => return Err(bad("missing unit after a number")),
            _ => return Err(bad(&format!("unknown unit `{unit}`"))),
        };
        total = number.checked_mul(scale).and_then(|ms| total.checked_add(ms)).ok_or_else(|| bad("too large"))?;
    }
    Ok(total)
}

impl<'de> Deserialize<'de> for DurationMs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // A visitor (not deserialize-then-validate) so errors are raised while the YAML
        // deserializer still knows the value's position.
        struct DurationVisitor;
        impl Visitor<'_> for DurationVisitor {
            type Value = DurationMs;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration: milliseconds or a string like `90s`, `10m`, `2h`")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<DurationMs, E> {
                Ok(DurationMs(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<DurationMs, E> {
                u64::try_from(v).map(DurationMs).map_err(|_| E::custom(format!("invalid duration `{v}`: durations must not be negative")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<DurationMs, E> {
                parse_duration(v).map(DurationMs).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(DurationVisitor)
    }
}
