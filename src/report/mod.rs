//! Reports: trace and summary writers, plots, the HTML report, the CI check (more to come:
//! compare, sweep).
pub mod audit;
pub mod check;
pub mod columns;
pub mod compare;
pub mod effects;
pub mod html;
pub mod output;
pub mod plots;
pub mod render;
pub mod sweep;

pub use html::{ReportInput, write_report};
