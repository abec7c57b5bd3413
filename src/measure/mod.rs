//! Measurement: token estimators, the provider cache simulator, prefix stability with cause
//! attribution, pricing, and the per-request metrics they produce.

pub mod billing;
pub mod blocks;
pub mod cache;
pub mod context_editing;
pub mod incremental;
pub mod loss;
pub mod metrics;
pub mod models;
pub mod o200k;
pub mod prefix;
pub mod structure;
pub mod token_cache;
pub mod tokens;

pub use blocks::{BlockPath, FlatRequest, PromptBlock, Region, flatten};
pub use cache::{CacheError, CacheOutcome, CacheSim, LookbackRule};
pub use metrics::{LaneSummary, MeasureInput, Measurer, MeasurerState, RequestMetrics, Served, StageReport, Summary};
pub use models::{ModelInfo, ModelTable, UnknownModel};
pub use prefix::{CAUSES, PrefixReport};
pub use tokens::{Calibration, EstimatorKind, TokenCounter};
