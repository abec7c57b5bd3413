//! The HTTP/1.1 layer of `serve`: requests read from a [`TcpStream`] whose every read has a
//! timeout, heads parsed by `httparse`, replies written with a `content-length`.
//!
//! A connection is read by [`Connection::next_request`]: the head (at most [`MAX_HEAD_BYTES`])
//! and then the body, announced by `content-length` or sent `chunked`. Every read waits at most
//! the read timeout, and a whole request must arrive before its deadline, so a client that
//! stalls, or trickles a byte at a time, ends its own connection (408) and nothing else.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::serve::{HttpReply, HttpRequest};

/// The largest request head (request line and headers).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The most headers a request may have.
const MAX_HEADERS: usize = 128;

/// How long a connection may wait.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// The longest silence while a request (or the next one on a kept-alive connection) is read.
    pub read: Duration,
    /// The longest a whole request, head and body, may take to arrive.
    pub request: Duration,
}

/// What reading the next request gave.
pub enum Incoming {
    /// A whole request; `keep_alive` when the connection stays open after the reply.
    Request { request: HttpRequest, keep_alive: bool },
    /// The client closed the connection (or went silent) between requests.
    Closed,
    /// The request cannot be read; the reply says why, then the connection is closed.
    Refused(HttpReply),
}

/// One accepted connection and the bytes read past the request being handled.
pub struct Connection {
    stream: TcpStream,
    pending: Vec<u8>,
    timeouts: Timeouts,
    max_body: usize,
}

/// Why a read stopped.
enum Stop {
    /// The peer closed the connection.
    Eof,
    /// No byte within the read timeout, or the request's deadline passed.
    TimedOut,
    Io,
}

impl Connection {
    pub fn new(stream: TcpStream, timeouts: Timeouts, max_body: usize) -> std::io::Result<Connection> {
        stream.set_write_timeout(Some(timeouts.read))?;
        stream.set_nodelay(true)?;
        Ok(Connection { stream, pending: Vec::new(), timeouts, max_body })
    }

    /// Reads more bytes into `pending`, waiting at most the read timeout and never past
    /// `deadline`.
    fn fill(&mut self, deadline: Instant) -> Result<(), Stop> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Stop::TimedOut);
        }
        self.stream.set_read_timeout(Some(left.min(self.timeouts.read))).map_err(|_| Stop::Io)?;
        let mut buf = [0u8; 16 * 1024];
        loop {
            return match self.stream.read(&mut buf) {
                Ok(0) => Err(Stop::Eof),
                Ok(n) => {
                    self.pending.extend_from_slice(&buf[..n]);
                    Ok(())
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => Err(Stop::TimedOut),
                Err(_) => Err(Stop::Io),
            };
        }
    }

    /// Takes `n` bytes from the front of `pending`, reading until they are there.
    fn take(&mut self, n: usize, deadline: Instant) -> Result<Vec<u8>, Stop> {
        while self.pending.len() < n {
            self.fill(deadline)?;
        }
        let rest = self.pending.split_off(n);
        Ok(std::mem::replace(&mut self.pending, rest))
    }

    /// Takes one CRLF-ended line (without the CRLF) from `pending`, at most `limit` bytes.
    fn line(&mut self, limit: usize, deadline: Instant) -> Result<Option<Vec<u8>>, Stop> {
        loop {
            if let Some(end) = self.pending.windows(2).position(|w| w == b"\r\n") {
                let mut line = self.take(end + 2, deadline)?;
                line.truncate(end);
                return Ok(Some(line));
            }
            if self.pending.len() > limit {
                return Ok(None);
            }
            self.fill(deadline)?;
        }
    }

    /// Reads the next request. The first byte of a request may take the read timeout to come
    /// (an idle kept-alive connection is closed then); the whole request must arrive within the
    /// request timeout.
    pub fn next_request(&mut self) -> Incoming {
        let deadline = Instant::now() + self.timeouts.request;
        let timed_out = || Incoming::Refused(HttpReply::error(408, "timeout_error", "the request did not arrive in time"));
        // The head.
        let (head_len, method, url, headers, version) = loop {
            let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut parsed = httparse::Request::new(&mut slots);
            match parsed.parse(&self.pending) {
                Ok(httparse::Status::Complete(len)) => {
                    let method = parsed.method.unwrap_or_default().to_owned();
                    let url = parsed.path.unwrap_or_default().to_owned();
                    let version = parsed.version.unwrap_or(1);
                    let headers: Vec<(String, String)> =
                        parsed.headers.iter().map(|h| (h.name.to_ascii_lowercase(), String::from_utf8_lossy(h.value).trim().to_owned())).collect();
                    break (len, method, url, headers, version);
                }
                Ok(httparse::Status::Partial) if self.pending.len() > MAX_HEAD_BYTES => {
                    return Incoming::Refused(HttpReply::error(431, "invalid_request_error", format!("request head exceeds {MAX_HEAD_BYTES} bytes")));
                }
                Ok(httparse::Status::Partial) => {}
                Err(e) => return Incoming::Refused(HttpReply::error(400, "invalid_request_error", format!("malformed request head: {e}"))),
            }
            match self.fill(deadline) {
                Ok(()) => {}
                // Nothing of a request yet: the client is done with the connection.
                Err(Stop::Eof | Stop::TimedOut | Stop::Io) if self.pending.iter().all(u8::is_ascii_whitespace) => return Incoming::Closed,
                Err(Stop::TimedOut) => return timed_out(),
                Err(Stop::Eof | Stop::Io) => return Incoming::Closed,
            }
        };
        self.pending.drain(..head_len);
        let header = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        let connection = header("connection").unwrap_or("").to_ascii_lowercase();
        let keep_alive = if version == 0 { connection.contains("keep-alive") } else { !connection.contains("close") };
        let chunked = header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        let length = match header("content-length") {
            None => None,
            Some(v) => match v.parse::<u64>() {
                Ok(n) => Some(n),
                Err(_) => return Incoming::Refused(HttpReply::error(400, "invalid_request_error", format!("content-length: not a number: `{v}`"))),
            },
        };
        if length.is_some_and(|n| n > self.max_body as u64) {
            return Incoming::Refused(too_large(self.max_body));
        }
        if header("expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue")) && (chunked || length.is_some_and(|n| n > 0)) {
            let _ = self.stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        let body = if chunked {
            self.chunked_body(deadline)
        } else {
            let n = usize::try_from(length.unwrap_or(0)).unwrap_or(usize::MAX);
            self.take(n, deadline).map(Ok)
        };
        match body {
            Ok(Ok(body)) => Incoming::Request { request: HttpRequest { method, url, headers, body }, keep_alive },
            Ok(Err(reply)) => Incoming::Refused(reply),
            Err(Stop::TimedOut) => timed_out(),
            // A body cut off by the client: there is no one to answer.
            Err(Stop::Eof | Stop::Io) => Incoming::Closed,
        }
    }

    /// A `transfer-encoding: chunked` body; `Ok(Err(reply))` when it is malformed or too large.
    fn chunked_body(&mut self, deadline: Instant) -> Result<Result<Vec<u8>, HttpReply>, Stop> {
        let bad = |what: &str| HttpReply::error(400, "invalid_request_error", format!("malformed chunked body: {what}"));
        let mut body = Vec::new();
        loop {
            let Some(line) = self.line(1024, deadline)? else { return Ok(Err(bad("chunk size line too long"))) };
            let size = String::from_utf8_lossy(&line);
            let size = size.split(';').next().unwrap_or("").trim();
            let Ok(size) = usize::from_str_radix(size, 16) else { return Ok(Err(bad("chunk size is not hexadecimal"))) };
            if size == 0 {
                // Trailers, up to the empty line.
                loop {
                    match self.line(MAX_HEAD_BYTES, deadline)? {
                        Some(l) if l.is_empty() => return Ok(Ok(body)),
                        Some(_) => {}
                        None => return Ok(Err(bad("trailer too long"))),
                    }
                }
            }
            if body.len().saturating_add(size) > self.max_body {
                return Ok(Err(too_large(self.max_body)));
            }
            body.extend(self.take(size, deadline)?);
            if self.take(2, deadline)? != b"\r\n" {
                return Ok(Err(bad("chunk not followed by CRLF")));
            }
        }
    }

    /// Writes a reply (without its body to a HEAD request).
    pub fn respond(&mut self, reply: &HttpReply, request_id: &str, head_only: bool, keep_alive: bool) -> std::io::Result<()> {
        let reason = http::StatusCode::from_u16(reply.status).ok().and_then(|s| s.canonical_reason()).unwrap_or("Status");
        let mut out = format!("HTTP/1.1 {} {reason}\r\ncontent-type: {}\r\nrequest-id: {request_id}\r\ncontent-length: {}\r\n", reply.status, reply.content_type, reply.body.len())
            .into_bytes();
        if !keep_alive {
            out.extend_from_slice(b"connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
        if !head_only {
            out.extend_from_slice(&reply.body);
        }
        self.stream.write_all(&out)?;
        self.stream.flush()
    }

    /// Closes both directions.
    pub fn close(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

fn too_large(max: usize) -> HttpReply {
    HttpReply::error(413, "request_too_large", format!("request body exceeds {max} bytes"))
}
