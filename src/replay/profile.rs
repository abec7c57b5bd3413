//! What a transcript does not say about the client that wrote it, per Claude Code version.
//!
//! A transcript holds the messages of every call but neither the system prompt, the tools nor
//! the user-context reminder in `messages[0]`, and none of the client's cache-relevant quirks.
//! The replay takes them from a [`ClientProfile`]:
//!
//! - **Sizes.** For 2.1.88 the system prompt and built-in tools were measured
//!   (reference/layers-1-5.md §2.4, §3.3; `data/profile-2.1.88.toml`) and give the prefix level
//!   when a session starts cold. For every version the replay infers the whole unrecorded part
//!   from the first call of each session (lane): its `cache_creation + cache_read + input`
//!   minus the estimate of the messages that call saw. The part the API can cache on its own
//!   (tools + system, the "prefix level" every post-compaction call reads) is that call's
//!   `cache_read` when it read anything (a warm start: an earlier session of the same client
//!   wrote exactly that prefix); for the main lane of a session recorded from its start, the
//!   total less the fitted user-context prior; otherwise the measured 2.1.88 size, capped by
//!   the inferred total. The rest is the user-context reminder that opens `messages[0]`. Later
//!   reads that fall to the prefix level set it (see `session.rs`).
//! - **Behaviour.** The first ToolSearch load of a deferred tool changes the tools array (a
//!   full miss); a Skill call re-renders the start of the conversation (the read falls to the
//!   prefix level; 4 of 5 real Skill calls did); a resumed session re-renders its start; in
//!   2.0.76–2.1.39 the previous turn's prompt is re-rendered at some new user turns (the
//!   "N-pattern"; reference/real-breaks.md), which the transcript does not show, so it is
//!   applied as an expected value with the measured rates.

use serde::Serialize;

use crate::agent::profile::SizeProfile;

/// Version-specific behaviour and sizes of the real client.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClientProfile {
    pub version: String,
    /// Rate of the N-pattern at a new user turn whose previous prompt is within the 20-position
    /// lookback of the new request's end (5 of 76 measured turns in 2.0.76–2.1.39).
    pub rerender_rate_near: f64,
    /// The same when the previous prompt is further back (10 of 27 measured turns).
    pub rerender_rate_far: f64,
    /// A first ToolSearch load of a deferred tool adds it to `tools`: a full miss.
    pub tool_search_full_miss: bool,
    /// A Skill tool call re-renders the conversation start.
    pub skill_rerender: bool,
    /// A resumed session re-renders its start.
    pub resume_rerender: bool,
    /// Tokens of tools + system to assume when the first call read nothing (cold start).
    pub cold_prefix_tokens: u64,
}

/// `"2.1.39"` → `(2, 1, 39)`; missing or non-numeric parts count as 0.
pub fn parse_version(version: &str) -> (u32, u32, u32) {
    let mut parts = version.split(|c: char| !c.is_ascii_digit()).filter(|p| !p.is_empty()).map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Tokens (chars/4) of the system prompt and built-in tools measured for 2.1.88: every section
/// and every tool's description, compact schema and ~40 characters of JSON framing per tool.
pub fn measured_prefix_tokens_2_1_88() -> u64 {
    let profile = SizeProfile::claude_code_2_1_88();
    let sections: usize = profile.sections.values().sum();
    let tools: usize = profile.tools.values().map(|t| t.description + t.schema + 40).sum();
    ((sections + tools) / 4) as u64
}

impl ClientProfile {
    pub fn for_version(version: &str) -> ClientProfile {
        let v = parse_version(version);
        let n_pattern = v >= (2, 0, 76) && v <= (2, 1, 39);
        ClientProfile {
            version: version.to_owned(),
            rerender_rate_near: if n_pattern { 5.0 / 76.0 } else { 0.0 },
            rerender_rate_far: if n_pattern { 10.0 / 27.0 } else { 0.0 },
            tool_search_full_miss: true,
            skill_rerender: true,
            resume_rerender: true,
            cold_prefix_tokens: measured_prefix_tokens_2_1_88(),
        }
    }

    /// Whether the version shows the N-pattern at all.
    pub fn rerenders_prompts(&self) -> bool {
        self.rerender_rate_near > 0.0 || self.rerender_rate_far > 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn n_pattern_is_confined_to_its_versions() {
        assert!(ClientProfile::for_version("2.0.76").rerenders_prompts());
        assert!(ClientProfile::for_version("2.1.39").rerenders_prompts());
        assert!(!ClientProfile::for_version("2.1.42").rerenders_prompts());
        assert!(!ClientProfile::for_version("2.0.75").rerenders_prompts());
        assert_eq!(parse_version("2.1.7"), (2, 1, 7));
    }

    #[test]
    fn measured_prefix_is_plausible() {
        let tokens = measured_prefix_tokens_2_1_88();
        assert!((8_000..40_000).contains(&tokens), "{tokens}");
    }
}
