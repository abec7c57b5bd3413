//! The Messages API client `ctxsim live` sends the agent's requests with: ureq, JSON or SSE as
//! the body's `stream` asks, bounded retries of 429 and 529 honouring `retry-after`.

use std::time::Duration;

use serde_json::Value;

use crate::api::{Request, Response};

use super::serve::TIME_HEADER;
use super::sse;

/// The API version header every request carries.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// The betas the real client 2.1.88 sends in base mode (oracle §3), minus its own
/// `claude-code-20250219`: our agent builds bodies with the same features.
pub const DEFAULT_BETAS: &[&str] =
    &["interleaved-thinking-2025-05-14", "context-management-2025-06-27", "prompt-caching-scope-2026-01-05", "effort-2025-11-24"];
/// Longest wait a `retry-after` is honoured for; a longer one is cut to this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Where and how to reach the API.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Without the trailing `/v1/messages`, e.g. `https://api.anthropic.com`.
    pub base_url: String,
    pub api_key: String,
    pub betas: Vec<String>,
    /// Retries of a 429/529 before the error is returned.
    pub max_retries: u32,
    pub timeouts: Timeouts,
}

/// How long a call may take: a stalled server ends the run with an error instead of hanging it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// To open the connection.
    pub connect: Duration,
    /// Of silence while waiting for the answer or any part of its body.
    pub read: Duration,
    /// Of one call, from connecting to the last byte of the body (each retry anew).
    pub total: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { connect: Duration::from_secs(10), read: Duration::from_secs(120), total: Duration::from_secs(600) }
    }
}

impl ClientConfig {
    /// From the environment: `ANTHROPIC_API_KEY` (required) and `ANTHROPIC_BASE_URL` (default
    /// `https://api.anthropic.com`).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<ClientConfig, LiveError> {
        let api_key = get("ANTHROPIC_API_KEY").filter(|k| !k.trim().is_empty()).ok_or(LiveError::NoApiKey)?;
        let base_url = get("ANTHROPIC_BASE_URL").filter(|u| !u.trim().is_empty()).unwrap_or_else(|| "https://api.anthropic.com".to_owned());
        Ok(ClientConfig { base_url, api_key, betas: DEFAULT_BETAS.iter().map(|b| (*b).to_owned()).collect(), max_retries: 4, timeouts: Timeouts::default() })
    }
}

/// What can go wrong talking to the API.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("ANTHROPIC_API_KEY is not set; `ctxsim live` sends the agent's requests to the real API")]
    NoApiKey,
    #[error("failed to reach {url}: {message}")]
    Transport { url: String, message: String },
    /// The API answered with an error (after any retries).
    #[error("the API answered {status}: {kind}: {message}")]
    Api { status: u16, kind: String, message: String },
    #[error("failed to read the API's answer: {0}")]
    Malformed(String),
    #[error("failed to write the run so far (--record, --trace): {0}")]
    Checkpoint(String),
}

/// One answered request.
#[derive(Debug, Clone)]
pub struct ApiReply {
    pub response: Response,
    /// The `request-id` header, when the API sent one.
    pub request_id: Option<String>,
    /// Retries it took (0 when the first attempt succeeded).
    pub retries: u32,
}

/// Sends Messages requests. The live runner takes any implementation, so a test can stand in
/// for the network.
pub trait MessagesApi {
    /// Sends `request`; `time_ms` is the run's virtual time of the request, passed to servers
    /// that measure on it (`ctxsim serve` reads it from `x-ctxsim-time-ms`; the real API ignores it).
    fn send(&mut self, request: &Request, time_ms: u64) -> Result<ApiReply, LiveError>;
}

/// The HTTP client over ureq.
pub struct HttpClient {
    config: ClientConfig,
    agent: ureq::Agent,
}

impl HttpClient {
    pub fn new(config: ClientConfig) -> HttpClient {
        let t = config.timeouts;
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(t.connect))
            .timeout_per_read(Some(t.read))
            .timeout_per_call(Some(t.total))
            .build()
            .into();
        HttpClient { config, agent }
    }

    fn url(&self) -> String {
        format!("{}/v1/messages", self.config.base_url.trim_end_matches('/'))
    }
}

/// An error body in the API's shape, or the text as the message.
fn api_error(status: u16, text: &str) -> LiveError {
    let value: Option<Value> = serde_json::from_str(text).ok();
    let field = |key: &str| value.as_ref().and_then(|v| v["error"][key].as_str()).map(str::to_owned);
    LiveError::Api {
        status,
        kind: field("type").unwrap_or_else(|| "http_error".to_owned()),
        message: field("message").unwrap_or_else(|| text.chars().take(500).collect()),
    }
}

/// How long to wait before retry number `attempt` (0-based): `retry-after` seconds when given
/// (capped), else 1, 2, 4, ... seconds.
pub fn retry_delay(retry_after: Option<&str>, attempt: u32) -> Duration {
    match retry_after.and_then(|v| v.trim().parse::<f64>().ok()).filter(|s| s.is_finite() && *s >= 0.0) {
        Some(seconds) => Duration::from_secs_f64(seconds).min(MAX_RETRY_AFTER),
        None => Duration::from_secs(1u64 << attempt.min(5)).min(MAX_RETRY_AFTER),
    }
}

impl MessagesApi for HttpClient {
    fn send(&mut self, request: &Request, time_ms: u64) -> Result<ApiReply, LiveError> {
        let url = self.url();
        let body = serde_json::to_vec(request).map_err(|e| LiveError::Malformed(e.to_string()))?;
        let mut retries = 0;
        loop {
            let mut call = self
                .agent
                .post(&url)
                .header("x-api-key", &self.config.api_key)
                .header("anthropic-version", ANTHROPIC_VERSION)
                .header("content-type", "application/json")
                .header(TIME_HEADER, time_ms.to_string());
            if !self.config.betas.is_empty() {
                call = call.header("anthropic-beta", self.config.betas.join(","));
            }
            let mut answer = call.send(&body[..]).map_err(|e| LiveError::Transport { url: url.clone(), message: e.to_string() })?;
            let status = answer.status().as_u16();
            let header = |name: &str| answer.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let request_id = header("request-id");
            let retry_after = header("retry-after");
            let is_stream = header("content-type").is_some_and(|t| t.starts_with("text/event-stream"));
            let text = answer
                .body_mut()
                .with_config()
                .limit(256 * 1024 * 1024)
                .read_to_string()
                .map_err(|e| LiveError::Transport { url: url.clone(), message: e.to_string() })?;
            if (status == 429 || status == 529) && retries < self.config.max_retries {
                std::thread::sleep(retry_delay(retry_after.as_deref(), retries));
                retries += 1;
                continue;
            }
            if status != 200 {
                return Err(api_error(status, &text));
            }
            let response = if is_stream {
                sse::read_stream(&text).map_err(|e| match e {
                    sse::StreamError::Api { kind, message } => LiveError::Api { status, kind, message },
                    other => LiveError::Malformed(other.to_string()),
                })?
            } else {
                serde_json::from_str(&text).map_err(|e| LiveError::Malformed(format!("response JSON: {e}")))?
            };
            return Ok(ApiReply { response, request_id, retries });
        }
    }
}
