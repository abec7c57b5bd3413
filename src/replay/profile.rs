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
//!   prefix level; 4 of 5 real Skill calls did); a resumed session re-renders its start; after
//!   a finished turn a side request caches the conversation through the last reply; in
//!   2.0.76–2.1.39 some prompts are rendered differently during their own turn than afterwards
//!   (the "N-pattern"; reference/real-breaks.md): the prompt that opened a conversation, and
//!   from 2.1.37 every prompt the user sent (see [`super::turns`]).

//!
//! Why this profile and not only [`crate::client_profile::VersionProfile`] or
//! [`crate::agent::profile::SizeProfile`]: those hold what a capture of a client measured
//! (bytes and tokens of its prompt pieces and tools, per version); this one holds behaviour read
//! from transcripts (which turns re-render, where autocompact fired, how Read numbered lines),
//! fitted on the realdata sessions, and refers to the measured sizes for its cold prefix. The
//! agent reads it where it drives a recorded session (`RecordedClient`, `workload`).

use serde::Serialize;

use crate::agent::profile::SizeProfile;

/// Version-specific behaviour and sizes of the real client.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClientProfile {
    pub version: String,
    /// The message that opened a conversation (the session's first prompt, or the compaction
    /// summary the model went on from) is re-rendered at the next user turn (2.0.76–2.1.39:
    /// 5 of 5 such turns in realdata broke, 6 of 7 second prompts in reference/real-breaks.md).
    pub rerender_opening_prompt: bool,
    /// Every prompt the user sent is re-rendered at the next user turn (2.1.37–2.1.39: 3 of 3
    /// in realdata, where 2.0.76–2.1.14 kept 25 of 25; the two 2.1.37+ sessions are also the
    /// only Opus 4.6 ones, so version and model are confounded).
    pub rerender_typed_prompts: bool,
    /// Typed prompts are re-rendered only when the prompt's record names a permission mode
    /// other than `bypassPermissions` (2.1.37–2.1.39: 3 of 3 in acceptEdits mode, 0 of 25 in
    /// bypassPermissions; one session each, see docs/fidelity.md "Break rules").
    pub typed_rerender_skips_bypass: bool,
    /// A prompt that delivers an item the client queued before a compaction (a background
    /// task's notification that waited in the queue through the turn the compaction happened
    /// in) renders the conversation start anew after the previous turn's side request: the read
    /// falls to the prefix level, once per compaction. Every version: the two such deliveries
    /// in realdata fell (spotter #153, 2.1.39; af1d #217, 2.1.49); a notification queued after
    /// the compaction read everything (e89f #174, 2.1.39), as did af1d's second item queued
    /// before the compaction, delivered next (#218). Why the client re-renders is not in the
    /// record (docs/fidelity.md "Queued across a compaction").
    pub queued_across_compaction_rerenders_start: bool,
    /// A side request after a finished turn caches the conversation through the last reply.
    pub post_turn_side_entry: bool,
    /// The side request is sent only after a turn the record shows ending normally (a
    /// `stop_hook_summary` between the turn's last call and the next prompt), whoever opened the
    /// turn (2.1.170+).
    pub side_entry_needs_stop_summary: bool,
    /// A new prompt after a turn that ended with the model's reply re-renders the start of the
    /// conversation; only the side request's entry (which renders it the same way) keeps the
    /// history cached (2.1.200+: 6 of 6 turns without a stop summary fell to the prefix level,
    /// see docs/fidelity.md).
    pub turn_rerenders_start: bool,
    /// ... and renders it differently only when the project's working tree may have changed
    /// since the prompt it was last rendered for (a write inside the project, a subagent, a
    /// file edited outside the conversation; [`super::worktree`]): git status is part of the
    /// start. 2.1.200+: d847's four prompts inside the TTL with no side entry, 3 after a turn
    /// that wrote the project (fell to the prefix level), 1 after one that did not (#168 read
    /// through the previous prompt).
    pub start_render_follows_tree: bool,
    /// The first ToolSearch load of the session adds the loaded tools to `tools`: a full miss
    /// (later loads do not move the tools array; from 2.1.200 no load does, 0 of 7 real loads
    /// in 2.1.205–2.1.232 broke).
    pub tool_search_full_miss: bool,
    /// A Skill tool call re-renders the conversation start (before 2.1.200; 0 of 9 Skill calls
    /// of 2.1.205–2.1.232 did).
    pub skill_rerender: bool,
    /// A new prompt after a turn in which a tool hook added context to a tool result
    /// (`hook_additional_context` with a tool use id) reads no side entry: the read falls to
    /// the prefix level (2.1.200–2.1.231: 6 of 6 such turns of oh-my-posh 0254, 2.1.219, inside
    /// the TTL and ended normally; 2.1.232 kept the cache at 2 of 2, entirecontext).
    pub tool_hook_context_loses_side_entry: bool,
    /// The static prefix (tools and the system prompt's static part, which 2.1.2xx/3xx marks
    /// with a global-scope breakpoint) stays warm across a gap beyond the TTL: other clients send
    /// the same bytes. Claude Desktop 2.1.200+ only ([`ClientProfile::for_client`]): its 4 of 4
    /// gaps beyond the 1h TTL read the prefix (oh-my-posh 0254 ×3, d847 ×1; and d847 #232 past
    /// a 5m TTL); the CLI's 4 of 4 read nothing (entirecontext ×3, NumWordify). Whether the CLI's
    /// prefix was its own setup's (plugins, MCP servers) or not marked global, the record cannot
    /// tell (docs/fidelity.md, "Changes in fid16").
    pub static_prefix_shared: bool,
    /// A resumed session re-renders its start.
    pub resume_rerender: bool,
    /// Tokens of tools + system to assume when the first call read nothing (cold start).
    pub cold_prefix_tokens: u64,
    /// The system prompt is cached at its end: its last block carries a cache marker of its own,
    /// so tools + the whole system prompt are a cache level (the one a read falls to after a
    /// compaction or a re-rendered start); else only the part before the dynamic boundary (tools
    /// and the static sections, global scope) is one. The agent follows it as
    /// `world.dynamic_system_marker` (the importer sets it, `workload::size_unmodelled`). Per
    /// version ([`SYSTEM_GLOBAL_SCOPE_BY_DEFAULT`], [`DYNAMIC_SYSTEM_BLOCK_MARKED`]):
    /// - up to 2.1.87 the global scope is behind a server-side flag, off unless forced: the
    ///   system prompt goes as `[billing, identity, rest]`, identity and rest each with an
    ///   org-scoped marker, so it is cached at its end (the agent's boundary layout with the
    ///   dynamic block marked has the same two levels: the importer sizes the part before the
    ///   boundary to the lower level the record shows);
    /// - 2.1.88 to 2.1.114: the global scope is on for first party and the dynamic block after
    ///   the boundary goes unmarked (the 2.1.88 capture, `data/profiles/2.1.88.toml`: markers
    ///   on `system[2]` global and the last message only);
    /// - from 2.1.116 the dynamic block carries an org-scoped marker (2.1.332's first-party
    ///   capture, reference/current-client-and-api.md §3.5).
    ///
    /// Evidence: the clients' own block splitter (the `cacheScope` it gives each system block,
    /// read in the npm packages of 2.1.49, 2.1.69, 2.1.78, 2.1.83, 2.1.85–2.1.89, 2.1.105,
    /// 2.1.112–2.1.114, 2.1.116, 2.1.119, 2.1.148 and 2.1.205; 2.0.76 has no boundary at all),
    /// and the records: 13 of the 16 shipped sessions (2.0.76–2.1.49 and
    /// 2.1.205–2.1.232) have a read that falls into the unrecorded part and each reads the
    /// whole prefix there, which an unmarked dynamic block cannot give (docs/profiles.md).
    pub system_cached_at_end: bool,
    /// The output reserve of the autocompact threshold (`window − min(max output, reserve) −
    /// buffer`): 32,000 up to 2.1.14 (5 automatic compactions of 2.0.76–2.1.14 at
    /// 155.0k–156.7k on 200k windows), 20,000 from 2.1.37 (5 of 2.1.37–2.1.49 at 167.1k–167.6k,
    /// the reference's value). Versions between take the earlier value.
    pub autocompact_output_reserve: u64,
    /// How the files a compaction restores number their lines: the Read tool's numbering of the
    /// version ([`crate::agent::tools::exec::LineNumbers`], whose doc gives the evidence: `→`
    /// up to 2.1.49, a tab from 2.1.88), rendered by the agent's one function
    /// ([`crate::agent::tools::exec::number_lines_as`]).
    #[serde(skip)]
    pub restore_line_numbers: crate::agent::tools::exec::LineNumbers,
}

/// The first version whose Read tool numbers lines `{n}\t` (the 2.1.88 capture); 2.1.49 is the
/// last seen with `{n:>6}→`. No session between them is in the data: 2.1.88 is assumed.
pub const TAB_LINE_NUMBERS: (u32, u32, u32) = (2, 1, 88);

/// The first version of the request layout seen in 2.1.205–2.1.232 (deferred tools as message
/// attachments, a re-rendered conversation start at each new prompt). No session between
/// 2.1.49 and 2.1.205 is in the data: 2.1.200 is the boundary assumed.
pub const CURRENT_LAYOUT: (u32, u32, u32) = (2, 1, 200);

/// The first version whose client remembers the body of a slash command it expanded (and of a
/// Skill call) as an invoked skill, re-attached after a compaction (`invoked_skills`; in the 2.1
/// line a command in `.claude/commands` is run as a skill). Chosen from the record: a 2.0.76
/// session (9878, `/workflows:review`, 16k characters) is already 5% over after its compaction
/// without it, and the 2.1.37–2.1.49 ones are under or level (e89f `/gsd:progress`, c644
/// `/gsd:discuss-phase`, 7be2 `/github-pr-review`).
pub const INVOKED_COMMANDS_RESTORED: (u32, u32, u32) = (2, 1, 0);

/// The first version seen keeping the side entry after a turn with a tool hook's context
/// (entirecontext, 2.1.232); 2.1.219 is the last seen losing it, versions between take the
/// earlier behaviour.
pub const HOOK_CONTEXT_KEEPS_SIDE_ENTRY: (u32, u32, u32) = (2, 1, 232);

/// The first version whose client puts the system prompt's static part under the global cache
/// scope without a flag (first party): 2.1.87 still gates it behind the server-side
/// `tengu_system_prompt_global_cache` flag, default off ([`ClientProfile::system_cached_at_end`]).
pub const SYSTEM_GLOBAL_SCOPE_BY_DEFAULT: (u32, u32, u32) = (2, 1, 88);
/// The first version whose dynamic system block (after the boundary) carries a cache marker of
/// its own: 2.1.114 leaves it unmarked, 2.1.116 marks it (org scope); no 2.1.115 was published.
pub const DYNAMIC_SYSTEM_BLOCK_MARKED: (u32, u32, u32) = (2, 1, 116);

/// The `entrypoint` Claude Desktop's transcripts name.
pub const CLAUDE_DESKTOP: &str = "claude-desktop";

/// `"2.1.39"` → `(2, 1, 39)`; missing or non-numeric parts count as 0.
pub fn parse_version(version: &str) -> (u32, u32, u32) {
    let mut parts = version.split(|c: char| !c.is_ascii_digit()).filter(|p| !p.is_empty()).map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Tokens (chars/4) of the system prompt and built-in tools measured for 2.1.88: every section
/// and every tool's description, compact schema and ~40 characters of JSON framing per tool.
pub fn measured_prefix_tokens_2_1_88() -> u64 {
    static TOKENS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TOKENS.get_or_init(|| {
        let profile = SizeProfile::claude_code_2_1_88();
        let sections: usize = profile.sections.values().sum();
        let tools: usize = profile.tools.values().map(|t| t.description + t.schema + 40).sum();
        ((sections + tools) / 4) as u64
    })
}

/// The prefix level of `version` in a fitted per-version profile (`Calibration::prefix_tokens`)
/// ([`fitted_for_version`]). The level is sizes only; it differs between setups of one version
/// too (MCP tools), so a replay uses it only where its own record shows none.
pub fn fitted_prefix_tokens(profile: &std::collections::BTreeMap<String, u64>, version: &str) -> Option<u64> {
    fitted_for_version(profile, version).map(|(tokens, _)| *tokens)
}

/// The entry of `version` in a fitted per-version profile: its own, else the nearest earlier
/// version's, else (older than every fitted version) the earliest one's; with the version
/// whose entry it is.
pub fn fitted_for_version<'a, T>(profile: &'a std::collections::BTreeMap<String, T>, version: &str) -> Option<(&'a T, &'a str)> {
    let want = parse_version(version);
    let mut versions: Vec<((u32, u32, u32), &'a String, &'a T)> = profile.iter().map(|(v, t)| (parse_version(v), v, t)).collect();
    versions.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
    let earlier = versions.iter().rev().find(|(v, _, _)| *v <= want);
    earlier.or(versions.first()).map(|(_, v, t)| (*t, v.as_str()))
}

/// [`fitted_for_version`], with a note when the entry is another version's: what `what` of
/// `version` was taken from.
pub fn fitted_with_note<'a, T>(profile: &'a std::collections::BTreeMap<String, T>, version: &str, what: &str, notes: &mut std::collections::BTreeSet<String>) -> Option<&'a T> {
    let (value, from) = fitted_for_version(profile, version)?;
    if parse_version(from) != parse_version(version) {
        let how = if parse_version(from) < parse_version(version) { "the nearest earlier fitted version" } else { "no earlier version is fitted" };
        notes.insert(format!("{what} of {version} taken from {from} ({how})"));
    }
    Some(value)
}

impl ClientProfile {
    pub fn for_version(version: &str) -> ClientProfile {
        let v = parse_version(version);
        let n_pattern = ((2, 0, 76)..=(2, 1, 39)).contains(&v);
        ClientProfile {
            version: version.to_owned(),
            rerender_opening_prompt: n_pattern,
            rerender_typed_prompts: ((2, 1, 37)..=(2, 1, 39)).contains(&v),
            typed_rerender_skips_bypass: true,
            queued_across_compaction_rerenders_start: true,
            post_turn_side_entry: v >= (2, 0, 76),
            side_entry_needs_stop_summary: v >= (2, 1, 170),
            turn_rerenders_start: v >= CURRENT_LAYOUT,
            start_render_follows_tree: v >= CURRENT_LAYOUT,
            tool_search_full_miss: v < CURRENT_LAYOUT,
            skill_rerender: v < CURRENT_LAYOUT,
            tool_hook_context_loses_side_entry: (CURRENT_LAYOUT..HOOK_CONTEXT_KEEPS_SIDE_ENTRY).contains(&v),
            static_prefix_shared: false,
            resume_rerender: true,
            cold_prefix_tokens: measured_prefix_tokens_2_1_88(),
            system_cached_at_end: !(SYSTEM_GLOBAL_SCOPE_BY_DEFAULT..DYNAMIC_SYSTEM_BLOCK_MARKED).contains(&v),
            autocompact_output_reserve: if v < (2, 1, 37) { 32_000 } else { 20_000 },
            restore_line_numbers: if v < TAB_LINE_NUMBERS { crate::agent::tools::exec::LineNumbers::Arrow } else { crate::agent::tools::exec::LineNumbers::Tab },
        }
    }

    /// The profile of `version` as run from `entrypoint` (the transcript's `entrypoint`, e.g.
    /// `cli` or `claude-desktop`): [`Self::for_version`] plus what depends on the client app.
    pub fn for_client(version: &str, entrypoint: Option<&str>) -> ClientProfile {
        let profile = ClientProfile::for_version(version);
        let desktop = entrypoint == Some(CLAUDE_DESKTOP);
        ClientProfile { static_prefix_shared: desktop && parse_version(version) >= CURRENT_LAYOUT, ..profile }
    }

    /// Whether the version shows the N-pattern at all.
    pub fn rerenders_prompts(&self) -> bool {
        self.rerender_opening_prompt || self.rerender_typed_prompts
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
        assert!(ClientProfile::for_version("2.1.37").rerender_typed_prompts);
        assert!(!ClientProfile::for_version("2.1.14").rerender_typed_prompts);
        assert!(ClientProfile::for_version("2.1.170").post_turn_side_entry);
    }

    #[test]
    fn only_claude_desktop_2_1_200_on_shares_its_static_prefix() {
        assert!(ClientProfile::for_client("2.1.219", Some("claude-desktop")).static_prefix_shared);
        assert!(!ClientProfile::for_client("2.1.232", Some("cli")).static_prefix_shared);
        assert!(!ClientProfile::for_client("2.1.219", None).static_prefix_shared);
        assert!(!ClientProfile::for_client("2.1.49", Some("claude-desktop")).static_prefix_shared);
        assert!(!ClientProfile::for_version("2.1.219").static_prefix_shared);
    }

    #[test]
    fn the_system_prompt_is_cached_at_its_end_except_from_2_1_88_to_2_1_114() {
        for version in ["2.0.76", "2.1.7", "2.1.49", "2.1.87", "2.1.116", "2.1.205", "2.1.232", "2.1.332"] {
            assert!(ClientProfile::for_version(version).system_cached_at_end, "{version}");
        }
        for version in ["2.1.88", "2.1.100", "2.1.114"] {
            assert!(!ClientProfile::for_version(version).system_cached_at_end, "{version}");
        }
    }

    #[test]
    fn fitted_prefix_falls_back_to_the_nearest_version() {
        let profile: std::collections::BTreeMap<String, u64> =
            [("2.0.76", 33_865), ("2.1.7", 34_260), ("2.1.37", 16_589), ("2.1.39", 17_842)].map(|(v, t)| (v.to_owned(), t)).into();
        assert_eq!(fitted_prefix_tokens(&profile, "2.0.76"), Some(33_865));
        assert_eq!(fitted_prefix_tokens(&profile, "2.1.14"), Some(34_260));
        assert_eq!(fitted_prefix_tokens(&profile, "2.1.38"), Some(16_589));
        assert_eq!(fitted_prefix_tokens(&profile, "2.0.70"), Some(33_865));
        assert_eq!(fitted_prefix_tokens(&Default::default(), "2.1.14"), None);
    }

    #[test]
    fn measured_prefix_is_plausible() {
        let tokens = measured_prefix_tokens_2_1_88();
        assert!((8_000..40_000).contains(&tokens), "{tokens}");
    }
}
