//! The live paths: a loopback Messages API answering from a script (`serve`), the API's
//! streaming format (`sse`), and the HTTP client the agent uses against the real API (`client`).
//! Only this module and `cli/` open sockets.

pub mod client;
pub mod http;
pub mod run;
pub mod script;
pub mod serve;
pub mod sse;

pub use script::{Script, ScriptError, ScriptedReply};
pub use serve::{HttpReply, HttpRequest, ServeOptions, ServeReport, ServerHandle, Service, Stopper, start};
