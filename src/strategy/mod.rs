//! Strategies: every knob of the pipeline in one serde struct, with presets, files and
//! `--set key=value` overrides. The default is Claude Code 2.1.88 as the reference measured it.

mod knobs;
pub mod presets;

pub use knobs::{AGENT_READ_KNOBS, BaseUrl, ENV_VARS, McpInstructionsMode, Strategy, StrategyError, TtlSetting};
