//! Layer 6: the long-context chain. Each stage is one file; [`chain`] holds the ordered list and
//! the runner; [`context`] the conversation and state the stages share; [`config`] every knob.
//!
//! The chain is sans-io: compaction summaries are requested as values
//! ([`context::CompactionRequest`]) and handed back through [`chain::Chain::finish_compaction`].

pub mod autocompact;
pub mod blocking_limit;
pub mod chain;
pub mod config;
pub mod context;
pub mod context_collapse;
pub mod counting;
pub mod generator;
pub mod grouping;
pub mod microcompact;
pub mod peers;
pub mod rebuild;
pub mod recovery;
pub mod session_memory;
pub mod snip;
pub mod tool_result_budget;

pub use chain::{Chain, ChainError, ChainStep, STAGES};
pub use config::CompactConfig;
pub use context::{
    ChainContext, ChainOutput, ChainState, CompactTrigger, CompactionReply, CompactionRequest, Entries, Entry, EntryKind,
    ModelLimits, QuerySource,
};
