//! ctxsim: a deterministic simulation and replay harness for a coding agent's context pipeline.
//!
//! Data flows scenario/recording → World → Agent → Measure → Report; see ARCHITECTURE.md.
pub mod agent;
pub mod analyze;
pub mod api;
pub mod cli;
pub mod client_profile;
pub mod fuzzing;
pub mod input;
pub mod live;
pub mod shape;
pub mod shared;
pub mod measure;
pub mod recording;
pub mod replay;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod strategy;
pub mod synth;
pub mod world;
