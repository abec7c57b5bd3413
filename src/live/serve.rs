//! `ctxsim serve`: a loopback Messages API that answers from a [`Script`] and measures every
//! request it gets with the project's cache simulator (docs/serve.md).
//!
//! [`Service`] is the whole API without sockets: a request in, a reply out, in arrival order.
//! [`start`] puts it behind a tiny_http listener on 127.0.0.1: every request is read on a
//! thread of its own (a client stalled inside its body holds only that thread, never the
//! others nor the shutdown), and the service answers them one at a time, in the order their
//! bodies arrived.
//!
//! **Time.** The server never reads the wall clock. Each `/v1/messages` request happens at a
//! virtual time: the `x-ctxsim-time-ms` header when the client sends one (ms, never going back),
//! else the previous request's time plus `step_ms` plus the previous reply's scripted `delay`.
//! The same sequence of requests gives byte-identical responses, logs, traces and summaries.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde_json::{Value, json};

use crate::agent::compact::recovery::simulated_api_error;
use crate::api::{CacheCreation, ContentBlock, Request, Response, StopReason, Usage};
use crate::measure::blocks::parse_request;
use crate::measure::{MeasureInput, Measurer, RequestMetrics, Summary};
use crate::recording::RequestLogEntry;
use crate::report::output::{trace_jsonl, write_atomic};
use crate::world::estimate_output_tokens;

use super::script::{ScriptedReply, Script};
use super::sse;

/// The header that sets a request's virtual time.
pub const TIME_HEADER: &str = "x-ctxsim-time-ms";
/// The largest virtual time a request may carry (2^53 − 1 ms, the largest integer a JSON
/// client represents exactly): later times would overflow the clock's arithmetic.
pub const MAX_TIME_MS: u64 = (1 << 53) - 1;
/// The API's request size limit (32 MB).
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Virtual ms between two requests that carry no time header.
    pub step_ms: u64,
    /// Tag in generated ids (`msg_<tag>_0001`, `toolu_<tag>_0001`): runs that resume each other
    /// need distinct tags, as the client rewrites a turn whose tool ids repeat.
    pub id_tag: String,
    /// Where the request log, trace and summary go.
    pub log_dir: Option<PathBuf>,
    /// Stop after this many `/v1/messages` requests.
    pub max_requests: Option<usize>,
    /// Stop once the last scripted main reply was served.
    pub exit_when_done: bool,
    /// Name of the input in the summary (the script's path).
    pub input_name: String,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions { step_ms: 1000, id_tag: "ctxsim".to_owned(), log_dir: None, max_requests: None, exit_when_done: false, input_name: "serve".to_owned() }
    }
}

/// One HTTP request, as the service needs it.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    pub method: String,
    pub url: String,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// The service's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpReply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl HttpReply {
    fn json(status: u16, value: &Value) -> HttpReply {
        HttpReply { status, content_type: "application/json", body: serde_json::to_vec(value).expect("JSON serializes") }
    }

    /// The API's error shape: `{"type":"error","error":{"type","message"}}`.
    pub fn error(status: u16, kind: &str, message: impl Into<String>) -> HttpReply {
        Self::json(status, &json!({"type": "error", "error": {"type": kind, "message": message.into()}}))
    }
}

/// What a finished server measured.
#[derive(Debug, Clone)]
pub struct ServeReport {
    pub rows: Vec<RequestMetrics>,
    pub summary: Summary,
    /// Scripted main replies never served.
    pub unserved_main: usize,
}

/// The request log of a served run, appended and flushed per request.
#[derive(Debug)]
struct RequestLogFile {
    file: std::fs::File,
}

/// The Messages API over a script, without sockets.
#[derive(Debug)]
pub struct Service {
    script: Script,
    measurer: Measurer,
    options: ServeOptions,
    rows: Vec<RequestMetrics>,
    clock_ms: u64,
    last_time_ms: Option<u64>,
    /// `/v1/messages` requests answered (errors included); `max_requests` counts measured ones.
    requests: usize,
    messages: usize,
    tool_ids: usize,
    log: Option<RequestLogFile>,
    /// Main and subagent lanes of the requests the script answers on `main`.
    lanes: crate::measure::structure::LaneRecognizer,
}

impl Service {
    /// A service. The request log of a log directory is created by [`Service::open_log`] (which
    /// [`start`] calls once the port is bound), so a server that cannot start leaves the
    /// previous log as it was.
    pub fn new(script: Script, measurer: Measurer, options: ServeOptions) -> std::io::Result<Service> {
        // No journal comes with a client's requests: causes are read from their structure.
        let mut measurer = measurer;
        measurer.set_structural_causes(true);
        Ok(Service {
            script,
            measurer,
            options,
            rows: Vec::new(),
            clock_ms: 0,
            last_time_ms: None,
            requests: 0,
            messages: 0,
            tool_ids: 0,
            log: None,
            lanes: Default::default(),
        })
    }

    /// Creates (truncates) `requests.jsonl` in the log directory, if there is one.
    pub fn open_log(&mut self) -> std::io::Result<()> {
        if let Some(dir) = &self.options.log_dir
            && self.log.is_none()
        {
            std::fs::create_dir_all(dir)?;
            let path = dir.join("requests.jsonl");
            // A FIFO or device given as the log is written in place (never replaced).
            let file = std::fs::OpenOptions::new().write(true).create(true).truncate(std::fs::metadata(&path).map_or(true, |m| m.is_file())).open(&path)?;
            self.log = Some(RequestLogFile { file });
        }
        Ok(())
    }

    /// The rows measured so far.
    pub fn rows(&self) -> &[RequestMetrics] {
        &self.rows
    }

    /// True when the server should stop: `max_requests` reached, or the script exhausted with
    /// `exit_when_done`.
    pub fn finished(&self) -> bool {
        self.options.max_requests.is_some_and(|max| self.rows.len() >= max) || (self.options.exit_when_done && self.script.main_exhausted())
    }

    /// Answers one request.
    pub fn handle(&mut self, request: &HttpRequest) -> HttpReply {
        let path = request.url.split(['?', '#']).next().unwrap_or("");
        let path = path.trim_end_matches('/');
        match (request.method.as_str(), path) {
            ("HEAD", "") => HttpReply { status: 200, content_type: "text/plain", body: Vec::new() },
            ("POST", "/v1/messages") => {
                self.requests += 1;
                self.messages(request)
            }
            ("POST", "/v1/messages/count_tokens") => self.count_tokens(&request.body),
            (method, _) => HttpReply::error(404, "not_found_error", format!("{method} {}: no such endpoint", request.url)),
        }
    }

    fn count_tokens(&mut self, bytes: &[u8]) -> HttpReply {
        let (body, _) = match parse_body(bytes) {
            Ok(parsed) => parsed,
            Err(reply) => return reply,
        };
        let family = match self.measurer.table().lookup(&body.model) {
            Ok(info) => info.estimator_key(),
            Err(e) => return HttpReply::error(404, "not_found_error", e.to_string()),
        };
        // From scratch: a count is not a request of any track.
        let flat = crate::measure::flatten(&body, self.measurer.counter_mut(), &family);
        HttpReply::json(200, &json!({"input_tokens": flat.total_tokens}))
    }

    fn messages(&mut self, request: &HttpRequest) -> HttpReply {
        let (body, raw) = match parse_body(&request.body) {
            Ok(parsed) => parsed,
            Err(reply) => return reply,
        };
        let time_ms = match request.headers.iter().find(|(name, _)| name == TIME_HEADER) {
            None => self.clock_ms,
            Some((_, value)) => match value.trim().parse::<u64>() {
                Ok(ms) if ms > MAX_TIME_MS => {
                    return HttpReply::error(400, "invalid_request_error", format!("header {TIME_HEADER}: {ms} is beyond the largest virtual time {MAX_TIME_MS}"));
                }
                Ok(ms) if self.last_time_ms.is_none_or(|last| ms >= last) => ms,
                Ok(ms) => return HttpReply::error(400, "invalid_request_error", format!("header {TIME_HEADER}: {ms} goes back before the previous request's time")),
                Err(_) => return HttpReply::error(400, "invalid_request_error", format!("header {TIME_HEADER}: not a whole number of milliseconds: `{value}`")),
            },
        };
        let info = match self.measurer.table().lookup(&body.model) {
            Ok(info) => info.clone(),
            Err(e) => return HttpReply::error(404, "not_found_error", format!("model: {e}")),
        };
        let script_lane = self.script.classify(&body);
        let served = match self.measurer.serve(&body) {
            Ok(served) => served,
            Err(e) => return HttpReply::error(404, "not_found_error", format!("model: {e}")),
        };
        // The script answers subagent turns from `main` (as the oracle did); the measurement
        // keeps them apart, recognized by their system prompt and tool set.
        let lane = match script_lane {
            "main" => {
                let assigned = self.lanes.assign(&body, served.as_sent());
                if assigned.new_conversation {
                    self.measurer.restart_lane(&assigned.lane);
                }
                assigned.lane
            }
            other => other.to_owned(),
        };
        // The API's 400s (a misplaced system message, a malformed edit list) and a prompt over
        // the window are rejected before any sampling.
        let rejected = served.error.clone().or_else(|| simulated_api_error(served.flat.total_tokens, info.context_window));
        // A rejected request samples nothing: the reply stays for the next request of its lane.
        let reply = rejected.is_none().then(|| self.script.next(script_lane));
        let mut input = MeasureInput::new(&lane, time_ms, &body);
        input.rejected = rejected;
        input.output_tokens = reply.as_ref().map_or(0, |r| estimate_output_tokens(&r.content));
        let row = match self.measurer.measure_served(input, served) {
            Ok(row) => row,
            Err(e) => return HttpReply::error(404, "not_found_error", format!("model: {e}")),
        };
        let delay_ms = reply.as_ref().map_or(0, |r| r.delay_ms);
        self.last_time_ms = Some(time_ms);
        self.clock_ms = time_ms.saturating_add(self.options.step_ms).saturating_add(delay_ms).min(MAX_TIME_MS);
        let (answer, usage) = match (&row.error, reply) {
            (Some(error), _) => (HttpReply::error(400, "invalid_request_error", error.clone()), None),
            (None, None) => unreachable!("a request that was not rejected has a reply"),
            (None, Some(reply)) => {
                let response = self.response(&body.model, reply, &row);
                let usage = response.usage.clone();
                let answer = if body.stream == Some(true) {
                    HttpReply { status: 200, content_type: "text/event-stream", body: sse::render(&response).into_bytes() }
                } else {
                    HttpReply::json(200, &serde_json::to_value(&response).expect("responses serialize"))
                };
                (answer, Some(usage))
            }
        };
        self.append_log(time_ms, raw, &lane, usage);
        self.rows.push(row);
        answer
    }

    /// The response to a measured request: scripted content with deterministic ids, the
    /// simulated usage (scaled and overridden as the reply says).
    fn response(&mut self, model: &str, reply: ScriptedReply, row: &RequestMetrics) -> Response {
        self.messages += 1;
        let mut content = reply.content;
        for block in &mut content {
            if let ContentBlock::ToolUse { id, .. } = block
                && id.is_empty()
            {
                self.tool_ids += 1;
                *id = format!("toolu_{}_{:04}", self.options.id_tag, self.tool_ids);
            }
        }
        let stop_reason = reply.stop_reason.unwrap_or(if content.iter().any(|b| matches!(b, ContentBlock::ToolUse { .. })) {
            StopReason::ToolUse
        } else {
            StopReason::EndTurn
        });
        let scale = |n: u64| reply.usage_scale.map_or(n, |s| (n as f64 * s).round() as u64);
        let split = CacheCreation {
            ephemeral_5m_input_tokens: scale(row.cache_creation.ephemeral_5m_input_tokens),
            ephemeral_1h_input_tokens: scale(row.cache_creation.ephemeral_1h_input_tokens),
        };
        let mut usage = Usage {
            input_tokens: scale(row.input_tokens),
            cache_creation_input_tokens: split.ephemeral_5m_input_tokens + split.ephemeral_1h_input_tokens,
            cache_read_input_tokens: scale(row.cache_read_input_tokens),
            cache_creation: Some(split),
            output_tokens: row.output_tokens,
            extra: serde_json::Map::new(),
        };
        if !reply.usage.is_empty() {
            let mut value = serde_json::to_value(&usage).expect("usage serializes");
            for (key, v) in reply.usage {
                value[key] = v;
            }
            // Overrides were checked to be usage fields when the script loaded.
            usage = serde_json::from_value(value).unwrap_or(usage);
        }
        Response {
            id: format!("msg_{}_{:04}", self.options.id_tag, self.messages),
            kind: "message".to_owned(),
            role: "assistant".to_owned(),
            model: model.to_owned(),
            content,
            stop_reason: Some(stop_reason),
            stop_sequence: None,
            usage,
            extra: serde_json::Map::new(),
        }
    }

    fn append_log(&mut self, time_ms: u64, body: Value, lane: &str, usage: Option<Usage>) {
        let Some(log) = &mut self.log else { return };
        let entry = RequestLogEntry { time_ms, body, lane: Some(lane.to_owned()), usage };
        let mut line = serde_json::to_vec(&entry).expect("log entries serialize");
        line.push(b'\n');
        // One write per line, flushed: a killed server leaves every answered request logged.
        if let Err(e) = log.file.write_all(&line).and_then(|()| log.file.flush()) {
            eprintln!("warning: failed to append to the request log: {e}");
        }
    }

    /// The run's report; with a log directory, the trace and summary are written there
    /// (atomically).
    pub fn finish(self) -> std::io::Result<ServeReport> {
        let estimator = self.measurer.counter().kind().name();
        let summary = Summary::from_rows(&self.options.input_name, "served", estimator, &self.rows, 0);
        if let Some(dir) = &self.options.log_dir {
            write_atomic(&dir.join("trace.jsonl"), &trace_jsonl(&self.rows))?;
            let mut text = serde_json::to_vec_pretty(&summary).expect("summaries serialize");
            text.push(b'\n');
            write_atomic(&dir.join("summary.json"), &text)?;
        }
        Ok(ServeReport { unserved_main: self.script.remaining("main"), rows: self.rows, summary })
    }
}

/// A body parsed as JSON and as a Messages API request; a bad one is the API's 400.
fn parse_body(bytes: &[u8]) -> Result<(Request, Value), HttpReply> {
    let bad = |message: String| HttpReply::error(400, "invalid_request_error", message);
    let raw: Value = serde_json::from_slice(bytes).map_err(|e| bad(format!("request body is not valid JSON: {e}")))?;
    if !raw.is_object() {
        return Err(bad("request body: expected a JSON object".to_owned()));
    }
    let body = parse_request(raw.clone()).map_err(|e| bad(format!("request body: {e}")))?;
    Ok((body, raw))
}

/// A running server.
pub struct ServerHandle {
    addr: SocketAddr,
    server: Arc<tiny_http::Server>,
    thread: JoinHandle<std::io::Result<ServeReport>>,
}

/// Stops a running server from anywhere (a signal handler, a test).
#[derive(Clone)]
pub struct Stopper(Arc<tiny_http::Server>);

impl Stopper {
    pub fn stop(&self) {
        self.0.unblock();
    }
}

impl ServerHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, what a client's `ANTHROPIC_BASE_URL` is set to.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn stopper(&self) -> Stopper {
        Stopper(Arc::clone(&self.server))
    }

    /// Stops accepting requests (the one being answered is finished) and returns the report.
    pub fn stop(self) -> std::io::Result<ServeReport> {
        self.server.unblock();
        self.wait()
    }

    /// Waits until the server stops by itself (`max_requests`, `exit_when_done`) or is
    /// stopped through a [`Stopper`].
    pub fn wait(self) -> std::io::Result<ServeReport> {
        self.thread.join().map_err(|_| std::io::Error::other("the server thread panicked"))?
    }
}

/// Binds 127.0.0.1:`port` (0 picks a free port), then opens the service's request log, and
/// serves: one thread accepts, one thread per request reads and answers it.
pub fn start(port: u16, mut service: Service) -> std::io::Result<ServerHandle> {
    let server = tiny_http::Server::http(("127.0.0.1", port)).map_err(std::io::Error::other)?;
    let addr = server.server_addr().to_ip().ok_or_else(|| std::io::Error::other("the listener has no IP address"))?;
    service.open_log()?;
    let server = Arc::new(server);
    let listener = Arc::clone(&server);
    let thread = std::thread::Builder::new().name("ctxsim-serve".to_owned()).spawn(move || serve_loop(listener, service))?;
    Ok(ServerHandle { addr, server, thread })
}

/// The service between request threads; `None` once the server has stopped.
type Shared = Arc<Mutex<Option<Service>>>;

fn serve_loop(server: Arc<tiny_http::Server>, service: Service) -> std::io::Result<ServeReport> {
    let shared: Shared = Arc::new(Mutex::new(Some(service)));
    for request in server.incoming_requests() {
        let (shared, server) = (Arc::clone(&shared), Arc::clone(&server));
        let spawned = std::thread::Builder::new().name("ctxsim-serve-request".to_owned()).spawn(move || answer(request, &shared, &server));
        if let Err(e) = spawned {
            eprintln!("warning: failed to start a request thread: {e}");
        }
    }
    // Stopped: requests still being read find no service and get a 503; the one being
    // answered finishes first (it holds the lock).
    let service = shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    service.ok_or_else(|| std::io::Error::other("the service was taken twice"))?.finish()
}

/// Reads one request's body (on its own thread), answers it under the service's lock, and
/// stops the server when the service is finished.
fn answer(mut request: tiny_http::Request, shared: &Shared, server: &tiny_http::Server) {
    let read = read_request(&mut request);
    let (reply, request_id, stop) = {
        let mut guard = shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match guard.as_mut() {
            Some(service) if !service.finished() => {
                let reply = match &read {
                    Ok(http) => service.handle(http),
                    Err(reply) => reply.clone(),
                };
                (reply, format!("req_{}_{:04}", service.options.id_tag, service.requests), service.finished())
            }
            _ => (HttpReply::error(503, "overloaded_error", "the server is shutting down"), "req_closed".to_owned(), false),
        }
    };
    let content_type = tiny_http::Header::from_bytes("content-type", reply.content_type).expect("static header is valid");
    let request_id = tiny_http::Header::from_bytes("request-id", request_id).expect("ids are ASCII");
    let length = (reply.content_type != "text/event-stream").then_some(reply.body.len());
    let response = tiny_http::Response::new(tiny_http::StatusCode(reply.status), vec![content_type, request_id], reply.body.as_slice(), length, None);
    if let Err(e) = request.respond(response) {
        eprintln!("warning: failed to send a response: {e}");
    }
    if stop {
        server.unblock();
    }
}

fn read_request(request: &mut tiny_http::Request) -> Result<HttpRequest, HttpReply> {
    let mut body = Vec::new();
    let limit = MAX_BODY_BYTES as u64 + 1;
    request
        .as_reader()
        .take(limit)
        .read_to_end(&mut body)
        .map_err(|e| HttpReply::error(400, "invalid_request_error", format!("failed to read the request body: {e}")))?;
    if body.len() > MAX_BODY_BYTES {
        return Err(HttpReply::error(413, "request_too_large", format!("request body exceeds {MAX_BODY_BYTES} bytes")));
    }
    let headers = request.headers().iter().map(|h| (h.field.as_str().as_str().to_ascii_lowercase(), h.value.as_str().to_owned())).collect();
    Ok(HttpRequest { method: request.method().as_str().to_owned(), url: request.url().to_owned(), headers, body })
}
