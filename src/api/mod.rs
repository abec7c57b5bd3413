//! Wire types of the Anthropic Messages API, as real clients send them.
//!
//! Every struct keeps the fields it does not model in an `extra` map, so any real request body
//! parses and serializes back to an equal JSON value. Field declaration order follows the order
//! Claude Code 2.1.88 writes its request body in (`model, messages, system, tools, tool_choice,
//! metadata, max_tokens, thinking, temperature, context_management, output_config, stream`), so a
//! request the agent builds serializes in the reference client's order.
//!
//! The canonical serialization used for hashing lives in [`canonical`].

pub mod canonical;
pub mod identical;
pub mod structural;
pub mod system_messages;
mod content;
mod request;
mod response;

pub use content::{ContentBlock, ImageLike, MessageContent, SharedBlocks, SharedText, ToolResultContent, block_hash_kept, joined_text};
pub(crate) use content::{BlockEntries, json_kind};
pub use request::{
    CacheControl, CacheScope, CacheTtl, Message, Request, Role, SharedValue, SharedVec, SystemBlock, SystemPrompt, Tool,
};
pub use response::{CacheCreation, Response, SharedMap, StopReason, Usage};
pub(crate) use response::USAGE_FIELDS;
