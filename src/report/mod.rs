//! Reports: trace and summary writers (more to come: compare, sweep, plots, HTML, check).
pub mod output;
pub mod render;
