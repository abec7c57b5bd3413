//! The agent: Claude Code's context pipeline, rebuilt as pure builders plus the session that
//! drives them.
//!
//! Layers 1–2 of a request (system blocks, tools) and the user-context message at messages[0].
//! Every builder takes plain inputs and returns wire types; none does I/O.

pub mod agents;
pub mod attachments;
pub mod hooks;
pub mod instructions;
pub mod memories;
pub mod normalize;
pub mod plugins;
pub mod read_state;
pub mod session;
pub mod skills;
pub mod compact;
pub mod dialect;
pub mod profile;
pub mod wording;
pub mod system_prompt;
pub mod tools;
pub mod user_context;
