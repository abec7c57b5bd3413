//! ctxsim: a deterministic simulation and replay harness for a coding agent's context pipeline.
pub mod api;
pub mod recording;
