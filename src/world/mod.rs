//! The World: everything outside the agent, made deterministic.
//!
//! The agent never does real I/O; all of it goes through a [`World`]: a virtual [`Clock`], a
//! [`VirtualFs`], a seeded [`Rng`] and a [`ScriptedModel`]. Given the same scenario and seed, a
//! World produces the same values in the same order on any machine, so every request the agent
//! builds is byte-identical across runs.
//!
//! # Determinism rules
//!
//! These hold for every module under `world/` and for anything that consumes a World:
//!
//! - **No wall clock.** Time is [`Clock::now_ms`]: virtual milliseconds since a per-scenario epoch.
//!   Nothing reads `SystemTime`/`Instant`, not even for logging or file mtimes.
//! - **No OS randomness.** Every random draw comes from one seeded [`Rng`], forked per subsystem by
//!   label (`rng.fork("hooks")`), so a new draw in one subsystem never shifts another's sequence.
//! - **No `HashMap` iteration in output.** Anything that is iterated to produce output is a
//!   `BTreeMap`/`BTreeSet`/`IndexMap` or a `Vec` sorted on a total order.
//! - **Sorted directory listings.** [`VirtualFs::list_dir`], [`VirtualFs::walk`] and
//!   [`VirtualFs::glob`] return sorted results, independent of insertion order.
//!   [`VirtualFs::load_from_dir`] is the only function here touching the real filesystem, and it
//!   reads directories sorted and ignores real mtimes.
//! - **No threads inside one simulation.** A World is used by one thread; parallelism exists only
//!   across independent simulations, whose results are merged in a fixed order.
//! - **Broken invariants panic** with the values in the message (e.g. moving the clock backwards);
//!   bad input is a [`WorldError`].

mod clock;
mod error;
mod fs;
mod model;
mod rng;
mod scripted;
mod state;

pub use clock::{Clock, parse_time_zone};
pub use error::WorldError;
pub use fs::{Change, ChangeKind, ChangeMark, DirAnswer, DirEntry, FileEntry, FragmentAnswers, LoadReport, Reads, VirtualFs, is_normal_path, normalize_path};
pub use model::{Fallback, Latency, Reply, ScriptedModel, Synthesis, estimate_output_tokens};
pub use rng::Rng;
pub use scripted::{GitState, HookAnswer, McpServer, McpToolDef};
pub use state::{ScriptedToolOutput, World};
