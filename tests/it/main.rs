//! The one integration-test binary: features tested through a few `check` helpers.
mod agent_layers;
mod analyze;
mod mechanisms;
mod cache;
mod recording;
mod requests;
mod scenario;
mod session;
mod support;
mod world;
