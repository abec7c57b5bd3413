//! The one integration-test binary: features tested through a few `check` helpers.
mod agent_layers;
mod analyze;
mod cache;
mod compact;
mod recording;
mod scenario;
mod support;
mod world;
