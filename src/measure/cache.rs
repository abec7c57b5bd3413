//! The provider's prompt cache, simulated by the documented rules.
//!
//! - The prefix runs tools → system → messages; an entry is the hash of the prefix ending at a
//!   block that carries `cache_control` (a *breakpoint*). Writes happen only at breakpoints.
//! - At most 4 breakpoints per request (the top-level automatic marker takes one slot); a fifth
//!   is the API's 400 error, returned here as [`CacheError`].
//! - Reads: for the last breakpoint, the positions from the breakpoint back are checked, the
//!   breakpoint itself first, at most 20 positions. The first live entry found is the hit. With
//!   no hit in that window, checking resumes at the next earlier breakpoint, and so on.
//!   On the Claude API a run of consecutive `tool_use` blocks counts as one of the 20, and so
//!   does a run of consecutive `tool_result` blocks (reference/current-client-and-api.md §1.1;
//!   [`CacheSim::group_tool_runs`], off for a provider where that is not stated). Requests sent
//!   before that counting was documented are measured by the rule their record shows
//!   ([`LookbackRule::PerBlock`]: one position per block that can carry a breakpoint, thinking
//!   blocks none, reaching 20 positions before the breakpoint).
//! - An entry exists only when the prefix up to its breakpoint has at least the model's minimum
//!   cacheable length; below it nothing is cached and both cache fields are 0.
//! - TTL is 5m or 1h, counted from the start of the request that writes or reads the entry, and
//!   refreshed on every hit. An entry becomes readable only once the writing request's response
//!   has begun (start + time to first token).
//! - 1h breakpoints must precede 5m ones (400 otherwise). Billing with mixed TTLs uses three
//!   positions: A = tokens at the highest hit, B = the highest 1h breakpoint after A (or A),
//!   C = the last breakpoint; read A, write 1h (B − A), write 5m (C − B).
//! - `input_tokens` is what follows the last breakpoint (total − C).
//! - Each model has its own namespace.
//!
//! - `cache_edits` (cached microcompact): a request's `cache_edits` block deletes the tool
//!   results it names by `cache_reference` from the server's copy. The prefix key ignores
//!   `cache_reference`, so entries stay readable; from the next request on, a tool_result that
//!   carries a deleted `cache_reference` counts 0 tokens (reported as
//!   `cache_deleted_input_tokens`). Ours: deletions are per model namespace and permanent.
//!
//! Where the documentation is silent we choose, and say so: a refreshed entry keeps the longer
//! of its own TTL and the reading breakpoint's; a breakpoint at or before the hit writes its
//! entry for free (its tokens were read); when B lies below the minimum length there is no 1h
//! entry and the whole write is billed at C's 5m rate.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::api::{CacheControl, CacheTtl};

use super::blocks::FlatRequest;

pub const LOOKBACK: usize = 20;

/// How the read's lookback counts its positions: the API's rule at the time a request was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LookbackRule {
    /// The Claude API as documented from September 2026 (reference/current-client-and-api.md
    /// §1.1): 20 positions counting the breakpoint as the first, a run of consecutive
    /// `tool_use` blocks one position, a run of `tool_result` blocks one.
    #[default]
    Grouped,
    /// What the recorded sessions sent before then show (docs/fidelity.md, "The lookback of
    /// 2026"): every block that can carry a breakpoint is one position (a thinking block, which
    /// cannot, is none; tool runs are not grouped), and an entry up to 20 positions before the
    /// breakpoint is found (the documentation's wording of 2025-12, "up to 20 blocks before each
    /// explicit breakpoint"). Four calls of Claude Code 2.1.209/2.1.215 (July 2026) after replies
    /// of 10–11 parallel tool calls decide it: 19 and 20 such positions read the previous
    /// request's entry, 21 and 22 fell to the system prompt's; counting thinking, or reaching
    /// only 19 back, gets one of the four wrong, grouping two.
    PerBlock,
}

/// The first instant (Unix ms, 2026-09-01T00:00:00Z) whose requests [`LookbackRule::Grouped`]
/// measures: the documentation snapshot of September 2026 (reference/current-client-and-api.md
/// §1.1) is the first to state the grouping; the earlier text (revision of 2026-03-20,
/// reference/api-and-formats.md) does not, and every shared session is older.
pub const GROUPED_LOOKBACK_FROM_EPOCH_MS: i64 = 1_788_220_800_000;

impl LookbackRule {
    /// The rule in force for a session that started at `start_epoch_ms` (Unix ms); a session
    /// of unknown time is measured by the current rule.
    pub fn for_session_start(start_epoch_ms: Option<i64>) -> Self {
        match start_epoch_ms {
            Some(ms) if ms < GROUPED_LOOKBACK_FROM_EPOCH_MS => LookbackRule::PerBlock,
            _ => LookbackRule::Grouped,
        }
    }
}
pub const MAX_BREAKPOINTS: usize = 4;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    #[error("A maximum of {max} blocks with cache_control may be provided. Found {found}.")]
    TooManyBreakpoints { found: usize, max: usize },
    #[error("a ttl='1h' cache_control block at position {one_hour} follows a ttl='5m' block at position {five_minutes}: 1h entries must come first")]
    TtlOrder { five_minutes: usize, one_hour: usize },
    #[error("the top-level cache_control ttl differs from the explicit marker on the last block (position {position})")]
    AutoTtlConflict { position: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    ttl: CacheTtl,
    expires_at: u64,
    available_at: u64,
}

/// A breakpoint of one request, after the automatic marker was placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Breakpoint {
    pub position: usize,
    pub ttl: CacheTtl,
    /// Cumulative prompt tokens through this position.
    pub tokens: u64,
    /// Whether this breakpoint holds an entry after the request (long enough to cache).
    pub cached: bool,
}

/// What the cache did for one request, with exactly the API's usage fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheOutcome {
    pub input_tokens: u64,
    pub cache_read_input_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub ephemeral_5m_input_tokens: u64,
    pub ephemeral_1h_input_tokens: u64,
    /// Position of the entry that was read (the highest hit).
    pub read_position: Option<usize>,
    pub breakpoints: Vec<Breakpoint>,
    /// The highest position within the lookback windows whose entry had expired.
    pub expired_position: Option<usize>,
    /// The highest live entry for this prefix that lay outside every lookback window.
    pub beyond_lookback_position: Option<usize>,
    /// The prefix was shorter than the model's minimum cacheable length at every breakpoint.
    pub below_minimum: bool,
    /// Tokens of tool results an earlier `cache_edits` deleted (not counted anywhere above).
    pub cache_deleted_input_tokens: u64,
}

impl CacheOutcome {
    /// Tokens this request leaves cached for the next one: what it read plus what it wrote.
    pub fn cached_after(&self) -> u64 {
        self.cache_read_input_tokens + self.cache_creation_input_tokens
    }
}

/// The simulated cache of one provider workspace.
#[derive(Debug, Clone)]
pub struct CacheSim {
    namespaces: BTreeMap<String, u32>,
    /// Keyed by namespace and prefix hash (already uniform: the fast hasher suffices).
    entries: FxHashMap<(u32, u128), Entry>,
    /// `cache_reference`s deleted by `cache_edits`, per namespace (looked up, never iterated
    /// into output).
    deleted: BTreeMap<u32, std::collections::BTreeSet<String>>,
    pub lookback: usize,
    /// A run of consecutive `tool_use` blocks, and one of consecutive `tool_result` blocks,
    /// count as one lookback position each (the Claude API's rule since late 2026).
    pub group_tool_runs: bool,
    /// Thinking blocks count as lookback positions (off under [`LookbackRule::PerBlock`]).
    pub count_thinking: bool,
}

impl Default for CacheSim {
    fn default() -> Self {
        CacheSim::new()
    }
}

impl CacheSim {
    pub fn new() -> Self {
        CacheSim {
            namespaces: BTreeMap::new(),
            entries: FxHashMap::default(),
            deleted: BTreeMap::new(),
            lookback: LOOKBACK,
            group_tool_runs: true,
            count_thinking: true,
        }
    }

    /// Counts the lookback by `rule` from the next request on (entries held are kept).
    pub fn set_lookback_rule(&mut self, rule: LookbackRule) {
        let (lookback, group_tool_runs, count_thinking) = match rule {
            LookbackRule::Grouped => (LOOKBACK, true, true),
            // The breakpoint and the 20 positions before it.
            LookbackRule::PerBlock => (LOOKBACK + 1, false, false),
        };
        self.lookback = lookback;
        self.group_tool_runs = group_tool_runs;
        self.count_thinking = count_thinking;
    }

    /// The lowest position the lookback from breakpoint `bp` reaches: `lookback` positions,
    /// the breakpoint first, where a run of tool_use blocks or of tool_result blocks is one
    /// ([`Self::group_tool_runs`]) and a thinking block none unless [`Self::count_thinking`].
    pub fn lookback_floor(&self, flat: &FlatRequest, bp: usize) -> usize {
        let mut counted = 1;
        let mut pos = bp;
        while pos > 0 {
            let (below, at) = (&flat.blocks[pos - 1].kind, &flat.blocks[pos].kind);
            let grouped = self.group_tool_runs && below == at && (below == "tool_use" || below == "tool_result");
            let uncounted = !self.count_thinking && matches!(&**below, "thinking" | "redacted_thinking");
            if !grouped && !uncounted {
                if counted == self.lookback {
                    break;
                }
                counted += 1;
            }
            pos -= 1;
        }
        pos
    }

    fn namespace(&mut self, model: &str) -> u32 {
        let next = self.namespaces.len() as u32;
        *self.namespaces.entry(model.to_owned()).or_insert(next)
    }

    /// Number of entries held (live or expired but not yet pruned).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Drops entries that expired before `now_ms`.
    pub fn prune(&mut self, now_ms: u64) {
        self.entries.retain(|_, e| e.expires_at > now_ms);
    }

    /// The breakpoints of a request: explicit markers plus the automatic one.
    pub fn breakpoints(flat: &FlatRequest) -> Result<Vec<(usize, CacheTtl)>, CacheError> {
        let mut points: Vec<(usize, CacheTtl)> = flat
            .markers
            .iter()
            .filter_map(|&i| flat.marker_ttl(i).map(|ttl| (i, ttl.unwrap_or(CacheTtl::FiveMinutes))))
            .collect();
        #[cfg(debug_assertions)]
        if !flat.ttl_overrides.is_empty() {
            let applied = flat.with_ttl_overrides_applied();
            let written: Vec<(usize, CacheTtl)> = applied.markers.iter().filter_map(|&i| applied.blocks[i].cache_control.as_ref().map(|cc| (i, cc.ttl_or_default()))).collect();
            assert_eq!(points, written, "the markers' TTLs read through the overrides differ from the overrides written into the records");
            assert!(flat.ttl_overrides.windows(2).all(|w| w[0].0 < w[1].0), "overrides not ascending: {:?}", flat.ttl_overrides);
        }
        if let Some(auto) = &flat.auto_cache_control {
            place_automatic(flat, auto, &mut points)?;
        }
        if points.len() > MAX_BREAKPOINTS {
            return Err(CacheError::TooManyBreakpoints { found: points.len(), max: MAX_BREAKPOINTS });
        }
        let mut first_5m = None;
        for &(position, ttl) in &points {
            match ttl {
                CacheTtl::FiveMinutes => {
                    first_5m.get_or_insert(position);
                }
                CacheTtl::OneHour => {
                    if let Some(five_minutes) = first_5m {
                        return Err(CacheError::TtlOrder { five_minutes, one_hour: position });
                    }
                }
            }
        }
        Ok(points)
    }

    /// Runs one request through the cache at virtual time `start_ms`. The entries it writes
    /// become readable at `start_ms + first_token_ms`, and their TTL (like the refresh of an
    /// entry it reads) counts from then: the prompt is processed by the first token.
    pub fn process(
        &mut self,
        flat: &FlatRequest,
        min_cacheable_tokens: u64,
        start_ms: u64,
        first_token_ms: u64,
    ) -> Result<CacheOutcome, CacheError> {
        let points = Self::breakpoints(flat)?;
        let ns = self.namespace(&flat.model);
        // Tokens through each position, less the blocks `cache_edits` deleted: the blocks'
        // own running sums unless something of this namespace was deleted.
        let mut deleted_tokens = 0u64;
        let deleted = self.deleted.get(&ns).filter(|d| !d.is_empty());
        let cumulative: Cumulative = match deleted {
            None => Cumulative::Blocks(flat),
            Some(deleted) => {
                let mut sums = Vec::with_capacity(flat.blocks.len());
                let mut running = 0u64;
                for block in flat.blocks.iter() {
                    if block.cache_reference.as_deref().is_some_and(|r| deleted.contains(r)) {
                        deleted_tokens += u64::from(block.tokens);
                    } else {
                        running += u64::from(block.tokens);
                    }
                    sums.push(running);
                }
                Cumulative::Sums(sums)
            }
        };
        let total = flat.total_tokens - deleted_tokens;
        let mut outcome = CacheOutcome { cache_deleted_input_tokens: deleted_tokens, ..CacheOutcome::default() };
        for &i in &flat.edit_blocks {
            self.deleted.entry(ns).or_default().extend(flat.blocks[i].cache_deletes.iter().flat_map(|deletes| deletes.iter().cloned()));
        }

        // Read: walk the breakpoints from the last one back.
        let mut hit: Option<usize> = None;
        let mut checked_floor = usize::MAX;
        for &(bp, _) in points.iter().rev() {
            let lowest = self.lookback_floor(flat, bp);
            let mut pos = bp;
            loop {
                // Positions already checked under a later breakpoint need no second look.
                if pos < checked_floor {
                    let key = (ns, flat.blocks[pos].prefix_hash);
                    if let Some(entry) = self.entries.get(&key) {
                        if entry.available_at <= start_ms && start_ms < entry.expires_at {
                            hit = Some(pos);
                            break;
                        }
                        if entry.expires_at <= start_ms && outcome.expired_position.is_none_or(|p| p < pos) {
                            outcome.expired_position = Some(pos);
                        }
                    }
                }
                if pos == lowest {
                    break;
                }
                pos -= 1;
            }
            if hit.is_some() {
                break;
            }
            checked_floor = checked_floor.min(lowest);
        }
        if hit.is_none() && !points.is_empty() {
            let last = points[points.len() - 1].0;
            for pos in (0..=last).rev() {
                let key = (ns, flat.blocks[pos].prefix_hash);
                if let Some(entry) = self.entries.get(&key)
                    && entry.available_at <= start_ms
                    && start_ms < entry.expires_at
                {
                    outcome.beyond_lookback_position = Some(pos);
                    break;
                }
            }
        }

        let read_tokens = match hit {
            Some(pos) => {
                let key = (ns, flat.blocks[pos].prefix_hash);
                let reading_ttl = points.iter().find(|(p, _)| *p >= pos).map(|(_, t)| *t).unwrap_or(CacheTtl::FiveMinutes);
                if let Some(entry) = self.entries.get_mut(&key) {
                    entry.ttl = entry.ttl.max(reading_ttl);
                    entry.expires_at = entry.expires_at.max(start_ms + first_token_ms + entry.ttl.millis());
                }
                cumulative[pos]
            }
            None => 0,
        };
        outcome.read_position = hit;

        // Write: every breakpoint long enough to cache holds an entry afterwards.
        let last_cached = points.iter().rev().find(|(p, _)| cumulative[*p] >= min_cacheable_tokens).map(|(p, _)| *p);
        outcome.below_minimum = !points.is_empty() && last_cached.is_none();
        for &(position, ttl) in &points {
            let tokens = cumulative[position];
            let cached = tokens >= min_cacheable_tokens;
            outcome.breakpoints.push(Breakpoint { position, ttl, tokens, cached });
            if !cached {
                continue;
            }
            let key = (ns, flat.blocks[position].prefix_hash);
            let expires_at = start_ms + first_token_ms + ttl.millis();
            let fresh = Entry { ttl, expires_at, available_at: start_ms + first_token_ms };
            self.entries
                .entry(key)
                .and_modify(|e| {
                    let live = e.available_at <= start_ms && start_ms < e.expires_at;
                    if live {
                        e.ttl = e.ttl.max(ttl);
                        e.expires_at = e.expires_at.max(start_ms + first_token_ms + e.ttl.millis());
                    } else {
                        *e = fresh;
                    }
                })
                .or_insert(fresh);
        }

        // Billing positions A, B, C.
        let a = read_tokens;
        let Some(c_pos) = last_cached else {
            outcome.input_tokens = total;
            outcome.cache_read_input_tokens = a;
            outcome.input_tokens = total - a;
            return Ok(outcome);
        };
        let c = cumulative[c_pos].max(a);
        let b = points
            .iter()
            .filter(|(p, ttl)| *ttl == CacheTtl::OneHour && cumulative[*p] > a && cumulative[*p] >= min_cacheable_tokens)
            .map(|(p, _)| cumulative[*p])
            .max()
            .unwrap_or(a)
            .min(c);
        outcome.cache_read_input_tokens = a;
        outcome.ephemeral_1h_input_tokens = b - a;
        outcome.ephemeral_5m_input_tokens = c - b;
        outcome.cache_creation_input_tokens = c - a;
        outcome.input_tokens = total - c;
        Ok(outcome)
    }
}

/// Places the top-level automatic marker on the last eligible block (walking back past
/// thinking and empty text blocks). Same-TTL explicit marker there: no-op; different: 400.
fn place_automatic(flat: &FlatRequest, auto: &CacheControl, points: &mut Vec<(usize, CacheTtl)>) -> Result<(), CacheError> {
    let Some(position) = flat.blocks.iter().rposition(|b| b.auto_eligible) else {
        return Ok(());
    };
    let ttl = auto.ttl_or_default();
    if let Some(existing) = points.iter().find(|(p, _)| *p == position) {
        if existing.1 == ttl {
            return Ok(());
        }
        return Err(CacheError::AutoTtlConflict { position });
    }
    points.push((position, ttl));
    points.sort_by_key(|(p, _)| *p);
    Ok(())
}

/// Tokens through each position of a request ([`CacheSim::process`]).
enum Cumulative<'a> {
    /// The blocks' own running sums (nothing deleted).
    Blocks(&'a FlatRequest),
    /// Running sums without the deleted blocks.
    Sums(Vec<u64>),
}

impl std::ops::Index<usize> for Cumulative<'_> {
    type Output = u64;

    fn index(&self, position: usize) -> &u64 {
        match self {
            Cumulative::Blocks(flat) => &flat.blocks[position].prefix_tokens,
            Cumulative::Sums(sums) => &sums[position],
        }
    }
}
