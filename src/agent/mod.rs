//! The agent: request building, tools, and (soon) the full context pipeline.
pub mod minimal;
