//! Replay of imported sessions through the measurement pipeline, and the fidelity report that
//! compares the simulated usage with the usage the API really billed.
//!
//! - [`profile`]: per-version client behaviour and sizes the transcript does not contain.
//! - [`session`]: a session loaded for measurement, the options its record is read under, and
//!   the per-call output of the agent's run of it ([`SessionReplay`]).
//! - [`sizing`]: what the record does not hold, sized (fillers, unstored thinking, the first
//!   call's unrecorded part), and recorded messages as the client sent them.
//! - [`record_view`]: what the record shows before each call (events, the unrecorded part's
//!   sizes) in one pass, without building a request: the agent's paths read the record by it.
//! - [`fidelity`]: per call and per session comparison with the recorded usage; calibration fit.
//! - [`crossval`]: leave-one-session-out and leave-one-project-out scores of the fit, per
//!   version group.
//! - [`plot`]: simulated against recorded context per call, as SVG and PNG.
//! - [`breaks`]: recorded cache breaks with the cause the replay attributes.
//! - [`turns`]: the post-turn side entry and the transient prompt rendering at a new user turn.
//! - [`triggers`]: where the agent's autocompact threshold fires on a real session, against
//!   the recorded `compact_boundary` records.
//! - [`no_effect`]: why a knob changed nothing on a recorded session, from what the record
//!   shows.
//! - [`loss`]: the information loss of each compaction (tokens, references lost, re-reads).
//! - [`workload`]: a recorded session as the scenario that drives the agent through it.
//! - [`working_set`]: the files (and plan) the client re-attaches after a compaction.
//! - [`audit_cache`]: `audit`'s per-session results kept across runs, keyed by a hash of
//!   everything that decides them.
//! - [`uncertainty`]: which calls' outcome rests on a modelled rule, and the range of
//!   Σcreation and cost the rules' observed hit rates leave open.

pub mod agent_whatif;
pub mod audit;
pub mod audit_cache;
pub mod breaks;
pub mod crossval;
pub mod discover;
pub mod fidelity;
pub mod loss;
pub mod no_effect;
pub mod plot;
pub mod profile;
pub mod record_view;
pub mod session;
pub mod sizing;
pub mod triggers;
pub mod workload;
pub mod turns;
pub mod uncertainty;
pub mod working_set;
pub mod worktree;

pub use breaks::{BreakRow, find_breaks};
pub use fidelity::{
    CallComparison, FidelityReport, FitSample, fidelity_calls_table, fidelity_for_session, fidelity_table, fit_calibration, fit_parameters, fit_samples, fitted_session, prefix_sample, session_fit, thinking_samples, user_context_sample, SessionFit, ThinkingSample,
};
pub use plot::{fidelity_chart, write_fidelity_plots};
pub use uncertainty::{Interval, Modelled, modelled_table};
pub use profile::{ClientProfile, parse_version};
pub use record_view::{CallView, RecordView, record_view, record_view_measured, record_view_observed};
pub use session::{CallReplay, ReplayOptions, SessionReplay, UnrecordedSizes, load_session};
pub use triggers::{TriggerReport, TriggerRow, agent_triggers, agent_triggers_table};
