//! `ctxsim serve`: a loopback Messages API that answers from a [`Script`] and measures every
//! request it gets with the project's cache simulator (docs/serve.md).
//!
//! [`Service`] is the whole API without sockets: a request in, a reply out, in arrival order.
//! [`start`] puts it behind a listener on 127.0.0.1 (the HTTP/1.1 layer is [`super::http`]):
//! every connection is read on a thread of its own, each read waiting at most the read
//! timeout (a client stalled inside its body holds only its thread, and only until then; never
//! the others nor the shutdown), and the service answers the requests one at a time, in the
//! order their bodies arrived.
//!
//! **Time.** The server never reads the wall clock. Each `/v1/messages` request happens at a
//! virtual time: the `x-ctxsim-time-ms` header when the client sends one (ms, never going back),
//! else the previous request's time plus `step_ms` plus the previous reply's scripted `delay`.
//! The same sequence of requests gives byte-identical responses, logs, traces and summaries.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{Value, json};

use crate::agent::compact::recovery::simulated_api_error;
use crate::api::{CacheCreation, ContentBlock, Request, Response, StopReason, Usage};
use crate::measure::blocks::parse_request;
use crate::measure::{MeasureInput, Measurer, RequestMetrics, Summary};
use crate::recording::RequestLogEntry;
use crate::report::output::{trace_jsonl, write_atomic};
use crate::world::estimate_output_tokens;

use super::http::{Connection, Incoming, Timeouts};
use super::script::{ScriptedReply, Script};
use super::sse;

/// The header that sets a request's virtual time.
pub const TIME_HEADER: &str = "x-ctxsim-time-ms";
/// The largest virtual time a request may carry (2^53 − 1 ms, the largest integer a JSON
/// client represents exactly): later times would overflow the clock's arithmetic.
pub const MAX_TIME_MS: u64 = (1 << 53) - 1;
/// The API's request size limit (32 MB).
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// `--read-timeout`'s default.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a whole request may take to arrive.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(600);
/// Headers kept beside the request log (`headers.jsonl`): they describe the client (its betas, its version) and
/// carry no session id or key.
const LOGGED_HEADERS: &[&str] = &["anthropic-beta", "anthropic-version", "user-agent", "x-app"];

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
    /// The longest silence while a connection's request is read (or the next one awaited).
    pub read_timeout: Duration,
    /// The longest a whole request may take to arrive.
    pub request_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            step_ms: 1000,
            id_tag: "ctxsim".to_owned(),
            log_dir: None,
            max_requests: None,
            exit_when_done: false,
            input_name: "serve".to_owned(),
            read_timeout: DEFAULT_READ_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
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
    /// `headers.jsonl`: line N holds the client-describing headers of `requests.jsonl`'s line N.
    headers: std::fs::File,
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
            let headers = std::fs::File::create(dir.join("headers.jsonl"))?;
            self.log = Some(RequestLogFile { file, headers });
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
        self.append_log(time_ms, raw, &lane, usage, &request.headers);
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
            extra: Default::default(),
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

    fn append_log(&mut self, time_ms: u64, body: Value, lane: &str, usage: Option<Usage>, headers: &[(String, String)]) {
        let Some(log) = &mut self.log else { return };
        let headers: std::collections::BTreeMap<&str, &str> = headers.iter().filter(|(name, _)| LOGGED_HEADERS.contains(&name.as_str())).map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let mut header_line = serde_json::to_vec(&headers).expect("headers serialize");
        header_line.push(b'\n');
        if let Err(e) = log.headers.write_all(&header_line).and_then(|()| log.headers.flush()) {
            eprintln!("warning: failed to append to the headers log: {e}");
        }
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
    stopper: Stopper,
    thread: JoinHandle<std::io::Result<ServeReport>>,
}

/// Stops a running server from anywhere (a signal handler, a test): raises the stop flag and
/// wakes the accepting thread with a connection of its own.
#[derive(Clone)]
pub struct Stopper(Arc<StopState>);

struct StopState {
    stopped: AtomicBool,
    addr: SocketAddr,
}

impl Stopper {
    pub fn stop(&self) {
        if !self.0.stopped.swap(true, Ordering::SeqCst) {
            // The accept loop is parked in accept(); a connection wakes it to see the flag.
            let _ = TcpStream::connect_timeout(&self.0.addr, Duration::from_secs(1));
        }
    }

    fn stopped(&self) -> bool {
        self.0.stopped.load(Ordering::SeqCst)
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
        self.stopper.clone()
    }

    /// Stops accepting requests (the one being answered is finished) and returns the report.
    pub fn stop(self) -> std::io::Result<ServeReport> {
        self.stopper.stop();
        self.wait()
    }

    /// Waits until the server stops by itself (`max_requests`, `exit_when_done`) or is
    /// stopped through a [`Stopper`].
    pub fn wait(self) -> std::io::Result<ServeReport> {
        self.thread.join().map_err(|_| std::io::Error::other("the server thread panicked"))?
    }
}

/// Binds 127.0.0.1:`port` (0 picks a free port), then opens the service's request log, and
/// serves: one thread accepts, one thread per connection (at most [`MAX_CONNECTIONS`] at once)
/// reads its requests, each read waiting at most `options.read_timeout`.
pub fn start(port: u16, mut service: Service) -> std::io::Result<ServerHandle> {
    let listener = TcpListener::bind(("127.0.0.1", port))?;
    let addr = listener.local_addr()?;
    service.open_log()?;
    let stopper = Stopper(Arc::new(StopState { stopped: AtomicBool::new(false), addr }));
    let timeouts = Timeouts { read: service.options.read_timeout, request: service.options.request_timeout };
    let accepting = stopper.clone();
    let thread = std::thread::Builder::new().name("ctxsim-serve".to_owned()).spawn(move || serve_loop(&listener, service, &accepting, timeouts))?;
    Ok(ServerHandle { addr, stopper, thread })
}

/// The most connections served at once; one more is answered 503 and closed.
pub const MAX_CONNECTIONS: usize = 256;

/// The service between connection threads; `None` once the server has stopped.
type Shared = Arc<Mutex<Option<Service>>>;

fn serve_loop(listener: &TcpListener, service: Service, stopper: &Stopper, timeouts: Timeouts) -> std::io::Result<ServeReport> {
    let shared: Shared = Arc::new(Mutex::new(Some(service)));
    let open = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        if stopper.stopped() {
            break;
        }
        let stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                eprintln!("warning: failed to accept a connection: {e}");
                // Out of file descriptors and the like: do not spin.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let mut connection = match Connection::new(stream, timeouts, MAX_BODY_BYTES) {
            Ok(connection) => connection,
            Err(e) => {
                eprintln!("warning: failed to set up a connection: {e}");
                continue;
            }
        };
        if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::SeqCst);
            let reply = HttpReply::error(503, "overloaded_error", format!("more than {MAX_CONNECTIONS} connections at once"));
            let _ = connection.respond(&reply, "req_busy", false, false);
            connection.close();
            continue;
        }
        let (shared, stopper, count) = (Arc::clone(&shared), stopper.clone(), Arc::clone(&open));
        let spawned = std::thread::Builder::new().name("ctxsim-serve-connection".to_owned()).spawn(move || {
            serve_connection(&mut connection, &shared, &stopper);
            connection.close();
            count.fetch_sub(1, Ordering::SeqCst);
        });
        if let Err(e) = spawned {
            open.fetch_sub(1, Ordering::SeqCst);
            eprintln!("warning: failed to start a connection thread: {e}");
        }
    }
    // Stopped: connections still reading find no service and get a 503; the request being
    // answered finishes first (it holds the lock).
    let service = shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    service.ok_or_else(|| std::io::Error::other("the service was taken twice"))?.finish()
}

/// Answers the requests of one connection, each under the service's lock, until the client
/// closes it, a read times out, or the server stops; stops the server when the service is
/// finished.
fn serve_connection(connection: &mut Connection, shared: &Shared, stopper: &Stopper) {
    loop {
        let (read, keep_alive) = match connection.next_request() {
            Incoming::Request { request, keep_alive } => (Ok(request), keep_alive),
            Incoming::Refused(reply) => (Err(reply), false),
            Incoming::Closed => return,
        };
        let head_only = read.as_ref().is_ok_and(|r| r.method == "HEAD");
        let (reply, request_id, stop, open) = {
            let mut guard = shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match guard.as_mut() {
                Some(service) if !service.finished() && !stopper.stopped() => {
                    let reply = match &read {
                        Ok(http) => service.handle(http),
                        Err(reply) => reply.clone(),
                    };
                    (reply, format!("req_{}_{:04}", service.options.id_tag, service.requests), service.finished(), true)
                }
                _ => (HttpReply::error(503, "overloaded_error", "the server is shutting down"), "req_closed".to_owned(), false, false),
            }
        };
        let keep_alive = keep_alive && open && !stop;
        if let Err(e) = connection.respond(&reply, &request_id, head_only, keep_alive) {
            eprintln!("warning: failed to send a response: {e}");
            return;
        }
        if stop {
            stopper.stop();
        }
        if !keep_alive {
            return;
        }
    }
}
