//! The fixed probe scenarios `ctxsim profile capture` drives a real client through, and the
//! small project every probe works in. Each probe is a `serve` script (the model's replies) plus
//! the client runs that send the prompts. The same probes, written as ctxsim scenarios
//! (`scenarios/probes/*.yaml`), drive our agent for the conformance measurement, so the two
//! sides see the same project, prompts and replies.

use serde_json::{Value, json};

/// The project every probe starts from: (path relative to the project, content).
pub const PROJECT_FILES: &[(&str, &str)] = &[
    ("CLAUDE.md", "# demo\nSmall arithmetic helpers. Run `python3 -m unittest` after a change.\n"),
    (".claude/rules/python.md", "---\npaths: [\"*.py\"]\n---\nKeep functions pure.\n"),
    ("calc.py", "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"),
    ("test_calc.py", "from calc import add\n\nassert add(2, 2) == 4\n"),
];

/// The commit the project's repository holds (message; author and committer date).
pub const COMMIT: (&str, &str) = ("calc helpers", "2026-01-14T10:00:00Z");

/// The day the clients' clock is pinned to where a preload can pin it (the `cli.js` build).
pub const DATE: &str = "2026-01-15";

/// When the shipped captures wrote the probes' project (the capture day, `[CAP]` in
/// current-client-and-api.md): later than [`DATE`], so files of a pinned capture are newer
/// than the pinned clock. The conformance scenarios give the files this modification time.
pub const FILES_WRITTEN: &str = "2026-12-01T12:00:00Z";

/// The session id every first run uses (a resume names it).
pub const SESSION_ID: &str = "00000000-0000-4000-8000-000000000001";

/// One client process of a probe.
#[derive(Debug, Clone, PartialEq)]
pub enum Run {
    /// `-p PROMPT --output-format json`.
    Print { prompt: &'static str },
    /// `--input-format stream-json`: each prompt sent after the previous turn's result.
    Turns { prompts: &'static [&'static str] },
    /// `--resume SESSION_ID -p PROMPT` in a new process, after the previous run.
    Resume { prompt: &'static str },
}

/// A probe: its name, what it exercises, the script `serve` answers from (`__P__` stands for
/// the project's absolute path), the client runs, whether it needs the MCP test server, and
/// extra environment for the client.
#[derive(Debug, Clone)]
pub struct Probe {
    pub name: &'static str,
    pub what: &'static str,
    pub script: Value,
    pub runs: Vec<Run>,
    pub mcp: bool,
    /// For a compaction probe: the tokens the second reply claims (cache read + creation).
    pub claimed_tokens: Option<u64>,
}

fn read(path: &str) -> Value {
    json!({"tool_use": {"name": "Read", "input": {"file_path": format!("__P__/{path}")}}})
}

/// A compaction probe: two tool rounds, the second reply claiming `claimed` tokens of context.
fn compaction(name: &'static str, claimed: u64) -> Probe {
    Probe {
        name,
        what: "two reads, then a reply claiming a large context: compacts when the claim passes the client's threshold",
        script: json!({
            "main": [
                {"content": [{"text": "Reading the module."}, read("calc.py")]},
                {"content": [read("test_calc.py")], "usage": {"cache_read_input_tokens": claimed - 1000, "cache_creation_input_tokens": 1000}},
                {"content": "calc.py has add and sub; the test checks add."}
            ],
            "summary_text": "<analysis>\nThe user asked about calc.py and its test; both were read.\n</analysis>\n<summary>\n1. Primary request: describe calc.py and its test.\n2. Files: calc.py (add, sub), test_calc.py.\n3. Pending: answer the question.\n</summary>"
        }),
        runs: vec![Run::Print { prompt: "What do calc.py and its test contain?" }],
        mcp: false,
        claimed_tokens: Some(claimed),
    }
}

/// The probes, in the order they run.
pub fn probes() -> Vec<Probe> {
    vec![
        Probe {
            name: "read",
            what: "one Read, then an answer",
            script: json!({"main": [
                {"content": [{"text": "Reading it."}, read("calc.py")]},
                {"content": "calc.py has add and sub; both are pure."}
            ]}),
            runs: vec![Run::Print { prompt: "What is in calc.py?" }],
            mcp: false,
            claimed_tokens: None,
        },
        Probe {
            name: "multi-tool",
            what: "Read, Edit, Bash in one turn",
            script: json!({"main": [
                {"content": [{"text": "I'll read the module first."}, read("calc.py")]},
                {"content": [{"tool_use": {"name": "Edit", "input": {"file_path": "__P__/calc.py", "old_string": "    return a - b", "new_string": "    return a - b\n\n\ndef mul(a, b):\n    return a * b"}}}]},
                {"content": [{"tool_use": {"name": "Bash", "input": {"command": "python3 test_calc.py && echo ok", "description": "Run the test"}}}]},
                {"content": "Added `mul` next to `sub`; the test still passes."}
            ]}),
            runs: vec![Run::Print { prompt: "Add a mul function to calc.py" }],
            mcp: false,
            claimed_tokens: None,
        },
        Probe {
            name: "mcp",
            what: "an MCP server with two tools; one called",
            script: json!({"main": [
                {"content": [{"tool_use": {"name": "mcp__demo__echo", "input": {"text": "hello"}}}]},
                {"content": "The demo server answered hello."}
            ]}),
            runs: vec![Run::Print { prompt: "Echo hello through the demo server." }],
            mcp: true,
            claimed_tokens: None,
        },
        Probe {
            name: "tool-search",
            what: "ToolSearch loads a deferred tool (an error result where tool search is off)",
            script: json!({"main": [
                {"content": [{"tool_use": {"name": "ToolSearch", "input": {"query": "select:WebFetch", "max_results": 1}}}]},
                {"content": "WebFetch is ready."}
            ]}),
            runs: vec![Run::Print { prompt: "Get the web fetch tool ready." }],
            mcp: false,
            claimed_tokens: None,
        },
        compaction("compact-166k", 166_000),
        compaction("compact-170k", 170_000),
        compaction("compact-966k", 966_000),
        compaction("compact-970k", 970_000),
        Probe {
            name: "multi-turn",
            what: "three prompts in one process (stream-json)",
            script: json!({"main": [
                {"content": [read("calc.py")]},
                {"content": "calc.py has add and sub."},
                {"content": [read("test_calc.py")]},
                {"content": "The test checks add."},
                {"content": "You are welcome."}
            ]}),
            runs: vec![Run::Turns { prompts: &["What is in calc.py?", "And in test_calc.py?", "Thanks."] }],
            mcp: false,
            claimed_tokens: None,
        },
        Probe {
            name: "resume",
            what: "a session, then `--resume` in a new process",
            script: json!({"main": [
                {"content": [read("calc.py")]},
                {"content": "calc.py has add and sub."},
                {"content": "Both functions take two numbers."}
            ]}),
            runs: vec![Run::Print { prompt: "What is in calc.py?" }, Run::Resume { prompt: "What do its functions take?" }],
            mcp: false,
            claimed_tokens: None,
        },
        Probe {
            name: "subagent",
            what: "the Agent tool runs a general-purpose subagent (in the background where the client does so); every later reply is text, so the order in which the lanes ask does not matter",
            script: json!({"main": [
                {"content": [{"tool_use": {"name": "Agent", "input": {"description": "Summarize calc.py", "prompt": "Summarize calc.py in one sentence.", "subagent_type": "general-purpose"}}}]},
                {"content": "calc.py defines the add and sub helpers."},
                {"content": "calc.py defines the add and sub helpers."},
                {"content": "calc.py defines the add and sub helpers."}
            ], "default_text": "calc.py defines the add and sub helpers."}),
            runs: vec![Run::Print { prompt: "Have a subagent summarize calc.py." }],
            mcp: false,
            claimed_tokens: None,
        },
    ]
}

/// The MCP test server (stdio, newline-delimited JSON-RPC): server `demo` with `echo` and `add`.
/// Our own minimal implementation of the protocol's initialize / tools/list / tools/call.
pub const MCP_SERVER: &str = r#"import json, sys
TOOLS = [
    {"name": "add", "description": "Adds two numbers.", "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}},
    {"name": "echo", "description": "Returns the text it is given.", "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
]
for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method = msg.get("method")
    if method == "initialize":
        result = {"protocolVersion": msg["params"].get("protocolVersion", "2025-06-18"), "capabilities": {"tools": {}}, "serverInfo": {"name": "demo", "version": "1.0.0"}, "instructions": "The demo server echoes and adds."}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        args = msg["params"].get("arguments", {})
        text = args.get("text", "") if msg["params"]["name"] == "echo" else str(args.get("a", 0) + args.get("b", 0))
        result = {"content": [{"type": "text", "text": text}]}
    else:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": "no such method"}}) + "\n")
        sys.stdout.flush()
        continue
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\n")
    sys.stdout.flush()
"#;

/// The `Date` preload for the `cli.js` build: the clock shifted to [`DATE`] (the client's own
/// override variable is stripped from release builds).
pub const FAKE_DATE: &str = include_str!("../../scripts/fakedate.cjs");
