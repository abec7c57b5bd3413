//! The one integration-test binary: features tested through a few `check` helpers.
mod agent_layers;
mod analyze;
mod mechanisms;
mod layer6;
mod cache;
mod fidelity;
mod compact;
mod recording;
mod requests;
mod check;
mod report;
mod scenario;
mod session;
mod support;
mod world;
