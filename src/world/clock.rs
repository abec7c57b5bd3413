//! Virtual time. A scenario fixes the epoch (a unix timestamp) and the local time zone; the
//! agent only ever sees time through this clock, so runs never depend on when they happen.

use jiff::Timestamp;
use jiff::tz::{Offset, TimeZone};

/// Virtual milliseconds since a fixed per-scenario epoch.
///
/// Time only moves forward: [`Clock::advance`] and [`Clock::set`] never go back, because the
/// cache simulator's TTLs and the fs change journal rely on time being monotonic.
#[derive(Debug, Clone)]
pub struct Clock {
    epoch_unix_ms: i64,
    now_ms: u64,
    time_zone: TimeZone,
    time_zone_name: String,
}

impl Clock {
    /// A clock at `epoch_unix_ms` (virtual time 0) in UTC.
    pub fn new(epoch_unix_ms: i64) -> Self {
        Clock { epoch_unix_ms, now_ms: 0, time_zone: TimeZone::UTC, time_zone_name: "UTC".to_owned() }
    }

    /// The same clock, with local dates computed in `time_zone` (see [`parse_time_zone`]).
    pub fn with_time_zone(mut self, time_zone: &str) -> Result<Self, String> {
        self.time_zone = parse_time_zone(time_zone)?;
        self.time_zone_name = time_zone.to_owned();
        Ok(self)
    }

    pub fn epoch_unix_ms(&self) -> i64 {
        self.epoch_unix_ms
    }

    pub fn time_zone_name(&self) -> &str {
        &self.time_zone_name
    }

    /// Virtual milliseconds since the epoch.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// The current time as unix milliseconds.
    pub fn now_unix_ms(&self) -> i64 {
        self.epoch_unix_ms.saturating_add(i64::try_from(self.now_ms).unwrap_or(i64::MAX))
    }

    pub fn advance(&mut self, ms: u64) {
        self.now_ms = self.now_ms.checked_add(ms).unwrap_or_else(|| {
            panic!("virtual clock overflow: now_ms={} advance={ms}", self.now_ms)
        });
    }

    /// Moves to virtual time `ms`. Panics when `ms` is earlier than now: callers schedule events
    /// from a validated script, so going back means a bug, not bad input.
    pub fn set(&mut self, ms: u64) {
        assert!(ms >= self.now_ms, "virtual clock moved backwards: now_ms={} set={ms}", self.now_ms);
        self.now_ms = ms;
    }

    pub fn timestamp(&self) -> Timestamp {
        timestamp_at(self.now_unix_ms())
    }

    /// The current time as RFC 3339 in UTC with millisecond precision (stable width, so strings
    /// built from it do not change length between runs).
    pub fn rfc3339(&self) -> String {
        self.timestamp().strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
    }

    /// The local date `YYYY-MM-DD` now, as the agent writes it into "currentDate".
    pub fn date_string(&self) -> String {
        self.date_string_at(self.now_ms)
    }

    /// The local date at virtual time `ms`.
    pub fn date_string_at(&self, ms: u64) -> String {
        let unix_ms = self.epoch_unix_ms.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX));
        self.time_zone.to_datetime(timestamp_at(unix_ms)).date().to_string()
    }

    /// True when the local date now differs from the local date at virtual time `earlier_ms`:
    /// the event that changes the date line of the system prompt and breaks the cached prefix.
    pub fn date_rolled_over_since(&self, earlier_ms: u64) -> bool {
        self.date_string_at(earlier_ms) != self.date_string()
    }
}

fn timestamp_at(unix_ms: i64) -> Timestamp {
    // Clamp instead of failing: the range of jiff timestamps (years -9999..9999) is far beyond
    // any scenario, and a clamp keeps this function total.
    Timestamp::from_millisecond(unix_ms)
        .unwrap_or(if unix_ms < 0 { Timestamp::MIN } else { Timestamp::MAX })
}

/// Parses a time zone: `UTC`/`Z`, a fixed offset `+05:30`/`-0800`, or an IANA name such as
/// `Europe/Paris`. Fixed offsets are fully deterministic; IANA names are resolved against the
/// tz database jiff finds, so a rule change in that database can change local dates.
pub fn parse_time_zone(text: &str) -> Result<TimeZone, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("utc") || text == "Z" {
        return Ok(TimeZone::UTC);
    }
    let (sign, digits) = match text.as_bytes().first() {
        Some(b'+') => (1, &text[1..]),
        Some(b'-') => (-1, &text[1..]),
        _ => return TimeZone::get(text).map_err(|e| format!("unknown time zone `{text}`: {e}")),
    };
    let digits: String = digits.chars().filter(|c| *c != ':').collect();
    // Checked before slicing so a non-ASCII suffix can never split a char.
    let all_digits = digits.bytes().all(|b| b.is_ascii_digit());
    let parsed = match digits.len() {
        _ if !all_digits => None,
        2 => digits.parse::<i32>().ok().map(|h| (h, 0)),
        4 => digits[..2].parse::<i32>().ok().zip(digits[2..].parse::<i32>().ok()),
        _ => None,
    };
    let Some((hours, minutes)) = parsed.filter(|(h, m)| *h <= 25 && *m < 60) else {
        return Err(format!("invalid UTC offset `{text}`, expected `+HH:MM` or `-HH:MM`"));
    };
    let offset = Offset::from_seconds(sign * (hours * 3600 + minutes * 60))
        .map_err(|e| format!("invalid UTC offset `{text}`: {e}"))?;
    Ok(TimeZone::fixed(offset))
}
