//! The one integration-test binary (links once).
mod scenario;
mod world;
