//! The one integration-test binary: features tested through a few `check` helpers.
mod agent_layers;
mod analyze;
mod mechanisms;
mod cache;
mod fidelity;
mod compact;
mod recording;
mod requests;
mod check;
mod compare;
mod strategies;
mod sweep;
mod report;
mod scenario;
mod session;
mod support;
mod world;
