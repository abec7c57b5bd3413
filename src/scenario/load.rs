//! Reading a scenario file: YAML → raw types (serde reports unknown keys and wrong types with
//! their position) → checks (which report a field path, located afterwards).

use std::path::Path;

use serde_path_to_error::Segment;

use super::check::{Seg, check, path_string};
use super::error::{Diagnostic, ScenarioError};
use super::locate::locate;
use super::raw::RawScenario;
use super::schema::Scenario;

/// Loads and validates a scenario file. A `world.mount[].from` that resolves into `/proc`,
/// `/sys` or `/dev`, or to anything but a directory or regular file, is an error naming the
/// file, line and field: a scenario must not read the process's environment (API keys) into
/// requests, logs or what `live` sends.
pub fn load_scenario(path: impl AsRef<Path>) -> Result<Scenario, ScenarioError> {
    load_scenario_confined(path, None)
}

/// [`load_scenario`], and with `root` every mount must also resolve inside `root` (an absolute
/// path elsewhere, a `..` or a link leading out is an error).
pub fn load_scenario_confined(path: impl AsRef<Path>, root: Option<&Path>) -> Result<Scenario, ScenarioError> {
    let path = path.as_ref();
    let text = crate::input::read_text(path).map_err(|e| match e {
        crate::input::TextError::Read { source, .. } => ScenarioError::Io { path: path.to_path_buf(), source },
        crate::input::TextError::Empty { file } => {
            ScenarioError::Invalid(Diagnostic { file, line: None, column: None, field: String::new(), message: "the file is empty".into() })
        }
        crate::input::TextError::Utf8 { file, line, column, byte } => ScenarioError::Invalid(Diagnostic {
            file,
            line: Some(line),
            column: Some(column),
            field: String::new(),
            message: format!("invalid UTF-8 (byte 0x{byte:02x})"),
        }),
    })?;
    let file_name = path.display().to_string();
    let mut scenario = parse_scenario(&text, &file_name)?;
    let base = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    for (i, mount) in scenario.world.mount.clone().into_iter().enumerate() {
        let real = confine_mount(base, root, &mount.from).map_err(|message| {
            let field = vec![Seg::Key("world".into()), Seg::Key("mount".into()), Seg::Index(i), Seg::Key("from".into())];
            let (line, column) = locate(&text, &field).unzip();
            ScenarioError::Invalid(Diagnostic { file: file_name.clone(), line, column, field: path_string(&field), message })
        })?;
        let mut fs = crate::world::VirtualFs::new();
        fs.load_from_dir(&real, &mount.at, &crate::world::Clock::new(0))
            .map_err(|e| ScenarioError::Io { path: real.clone(), source: std::io::Error::other(e.to_string()) })?;
        for (file, entry) in fs.files() {
            if !scenario.world.files.contains_key(file) {
                scenario.world.files.insert(file.to_owned(), String::clone(&entry.contents).into());
            }
        }
    }
    Ok(scenario)
}

/// The real path of a mount's `from`, or why it may not be read.
fn confine_mount(base: &Path, root: Option<&Path>, from: &str) -> Result<std::path::PathBuf, String> {
    let joined = base.join(from);
    let real = std::fs::canonicalize(&joined).map_err(|e| format!("`{from}`: {e}"))?;
    for special in ["/proc", "/sys", "/dev"] {
        if real.starts_with(special) {
            return Err(format!("`{from}` resolves to {}, a system directory a scenario may not mount", real.display()));
        }
    }
    if let Some(root) = root {
        let root = std::fs::canonicalize(root).map_err(|e| format!("the mount root {} cannot be resolved: {e}", root.display()))?;
        if !real.starts_with(&root) {
            return Err(format!("`{from}` resolves to {}, outside the mount root {}; a mount must stay inside it", real.display(), root.display()));
        }
    }
    let meta = std::fs::metadata(&real).map_err(|e| format!("`{from}`: {e}"))?;
    if !(meta.is_dir() || meta.is_file()) {
        return Err(format!("`{from}` is not a directory or a regular file"));
    }
    Ok(real)
}

/// The deepest YAML nesting a scenario or strategy file may have. Real ones nest under 12
/// levels; the YAML parser's time grows with the square of the depth (a 128 KB file of nested
/// lists took over 20 s), so deeper text is refused before it is parsed.
pub const MAX_YAML_DEPTH: usize = 64;

/// Refuses YAML text nested deeper than [`MAX_YAML_DEPTH`]: the line where the limit is first
/// crossed and a message. One pass, no parsing: block levels by indentation and `- ` (or `? `)
/// entries, flow levels by `[`/`{`. What YAML reads as scalar text adds no level, as the parser
/// reads it: the lines of a block scalar (`|`, `>`: every line after its header indented past
/// the key or entry that holds it), a quoted scalar to its closing quote (escapes in double
/// quotes, across lines), and a plain scalar's characters (`a {b` in block context is text; a
/// value opens a flow collection only when it starts with `[` or `{`). In flow context every
/// bracket outside quotes counts, and a quote opens a scalar only where a node starts, so text
/// is never taken for a scalar the parser would nest into (a written scenario's code and JSON
/// inside tool results and file contents counted as nesting before: `import --to scenario` of
/// af1d and d847 was refused by `run`).
pub fn check_yaml_depth(text: &str) -> Result<(), (usize, String)> {
    let mut indents: Vec<usize> = Vec::new();
    let mut scan = FlowScan::default();
    // The column a block scalar's lines must be indented past, while inside one.
    let mut block_scalar: Option<usize> = None;
    for (i, line) in text.lines().enumerate() {
        let content = line.trim_start_matches(' ');
        let indent = line.len() - content.len();
        if let Some(parent) = block_scalar {
            if content.trim().is_empty() || indent > parent {
                continue;
            }
            block_scalar = None;
        }
        if scan.quote.is_some() || scan.flow > 0 {
            // Inside a quoted scalar or a flow collection: no block structure on this line.
            // Nested below the block entries of the line that opened it.
            let deepest = scan.base + scan.run(content);
            if deepest > MAX_YAML_DEPTH {
                return Err(too_deep(i, deepest));
            }
            continue;
        }
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        while indents.last().is_some_and(|&top| top >= indent) {
            indents.pop();
        }
        indents.push(indent);
        let mut rest = content;
        let mut entries = 0;
        // The column of the node the rest of the line holds (for a block scalar's lines).
        let mut column = indent;
        while let Some(after) = ["- ", "-\t", "? ", ": "].iter().find_map(|p| rest.strip_prefix(p)) {
            entries += 1;
            column = line.len() - rest.len();
            rest = after.trim_start_matches([' ', '\t']);
        }
        if ["-", "?"].contains(&rest) {
            entries += 1;
            rest = "";
        }
        // The value: after a key (plain or quoted) and `: `, or the whole rest.
        let (value, keyed) = match split_key(rest) {
            Some(value) => (value, true),
            None => (rest, false),
        };
        let value = skip_properties(value);
        let depth_before = indents.len() + entries;
        if is_block_scalar_header(value) {
            block_scalar = Some(if keyed { line.len() - rest.len() } else { column });
        } else if value.starts_with(['[', '{', '"', '\'']) {
            scan.base = depth_before;
            let deepest = scan.value(value);
            if depth_before + deepest > MAX_YAML_DEPTH {
                return Err(too_deep(i, depth_before + deepest));
            }
        }
        if depth_before > MAX_YAML_DEPTH {
            return Err(too_deep(i, depth_before));
        }
    }
    Ok(())
}

fn too_deep(line_index: usize, depth: usize) -> (usize, String) {
    (line_index + 1, format!("nested {depth} levels deep, more than the {MAX_YAML_DEPTH} a scenario or strategy may have"))
}

/// Flow collections and quoted scalars as [`check_yaml_depth`] reads them, across lines.
#[derive(Default)]
struct FlowScan {
    /// Open flow collections.
    flow: usize,
    /// The quote of an open quoted scalar.
    quote: Option<char>,
    /// The previous character in double quotes was an unescaped backslash.
    escaped: bool,
    /// A node may start here (after `[`, `{`, `,` or a `:` that ends a key): only there does a
    /// quote open a scalar.
    node_start: bool,
    /// The block depth of the line that opened the flow collection or quoted scalar.
    base: usize,
}

impl FlowScan {
    /// Reads `text` and returns the deepest flow level reached on it. A block value is read from
    /// its start ([`Self::value`]); a line inside a flow collection or quoted scalar, on.
    fn run(&mut self, text: &str) -> usize {
        let mut deepest = self.flow;
        let mut after_space = true;
        // A backslash at the end of the previous line escaped its line break, not this line's
        // first character.
        self.escaped = false;
        // The last token closed a quoted scalar or a flow collection (`"a":` is a key there,
        // as JSON writes it; `a:b` in plain text is not).
        let mut after_close = false;
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            if let Some(q) = self.quote {
                if self.escaped {
                    self.escaped = false;
                } else if q == '"' && c == '\\' {
                    self.escaped = true;
                } else if c == q && q == '\'' && chars.peek() == Some(&'\'') {
                    // `''` is a quote inside single quotes.
                    chars.next();
                } else if c == q {
                    self.quote = None;
                    self.node_start = false;
                    after_close = true;
                }
                after_space = false;
                continue;
            }
            let space = matches!(c, ' ' | '\t');
            match c {
                '#' if after_space => break,
                '"' | '\'' if self.node_start => self.quote = Some(c),
                '[' | '{' => {
                    self.flow += 1;
                    deepest = deepest.max(self.flow);
                    self.node_start = true;
                }
                ']' | '}' => {
                    self.flow = self.flow.saturating_sub(1);
                    self.node_start = false;
                }
                ',' => self.node_start = true,
                // A `:` ends a key when a blank follows it (libyaml's plain scalars run past any
                // other), or right after a closed quote or collection.
                ':' => self.node_start = after_close || matches!(chars.peek(), None | Some(' ' | '\t')),
                _ if space => {}
                _ => self.node_start = false,
            }
            if !space {
                after_close = matches!(c, ']' | '}');
            }
            // Outside flow collections and quotes, the rest of a block value is plain text,
            // unless the collection or quote just closed was a key: its value follows the `: `.
            if self.flow == 0 && self.quote.is_none() && !space {
                if after_close || (c == '"' || c == '\'') {
                    let mut look = chars.clone();
                    while look.next_if(|c| matches!(c, ' ' | '\t')).is_some() {}
                    if look.next() == Some(':') && matches!(look.peek(), None | Some(' ' | '\t')) {
                        chars = look;
                        self.node_start = true;
                        after_space = true;
                        continue;
                    }
                }
                break;
            }
            after_space = space;
        }
        deepest
    }

    /// [`Self::run`] over a block value that starts with a flow collection or a quote.
    fn value(&mut self, value: &str) -> usize {
        self.node_start = true;
        self.run(value)
    }
}

/// The value after a block mapping key on a line (`key: value`, `"key": value`, `key:`), or
/// `None` when the line holds no key.
fn split_key(rest: &str) -> Option<&str> {
    let key_end = if rest.starts_with(['"', '\'']) {
        let end = quoted_len(rest)?;
        rest[end..].trim_start_matches([' ', '\t']).starts_with(':').then(|| end + rest[end..].find(':').unwrap_or(0))?
    } else {
        if rest.starts_with(['[', '{']) {
            return None;
        }
        // A plain key ends at the first `: ` (or a `:` ending the line) before any comment.
        let bytes = rest.as_bytes();
        (0..bytes.len()).find(|&at| {
            bytes[at] == b':' && (at + 1 == bytes.len() || matches!(bytes[at + 1], b' ' | b'\t'))
        }).filter(|&at| !rest[..at].contains(" #"))?
    };
    Some(rest[key_end + 1..].trim_start_matches([' ', '\t']))
}

/// The length of the quoted scalar `text` starts with, through its closing quote (`\"` and `\\`
/// escaped in double quotes, `''` a quote in single ones); `None` when it does not close on it.
fn quoted_len(text: &str) -> Option<usize> {
    let quote = text.chars().next()?;
    let mut chars = text.char_indices().skip(1).peekable();
    while let Some((at, c)) = chars.next() {
        let escape = (quote == '"' && c == '\\') || (c == quote && quote == '\'' && chars.peek().is_some_and(|&(_, n)| n == '\''));
        if escape {
            chars.next();
        } else if c == quote {
            return Some(at + 1);
        }
    }
    None
}

/// `value` after its anchor and tag (`&a`, `!!seq`), which precede the node they qualify.
fn skip_properties(mut value: &str) -> &str {
    while value.starts_with(['&', '!']) {
        value = value.split_once([' ', '\t']).map_or("", |(_, after)| after.trim_start_matches([' ', '\t']));
    }
    value
}

/// `|` or `>` with optional chomping and indentation indicators, then nothing but a comment.
fn is_block_scalar_header(value: &str) -> bool {
    let Some(indicators) = value.strip_prefix(['|', '>']) else { return false };
    let (head, comment) = indicators.split_once([' ', '\t']).unwrap_or((indicators, ""));
    let comment = comment.trim_start_matches([' ', '\t']);
    head.len() <= 2 && head.chars().all(|c| matches!(c, '+' | '-' | '1'..='9')) && (comment.is_empty() || comment.starts_with('#'))
}

/// Parses and validates scenario text; `file_name` is used in messages only.
pub fn parse_scenario(text: &str, file_name: &str) -> Result<Scenario, ScenarioError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if let Err((line, message)) = check_yaml_depth(text) {
        return Err(ScenarioError::Invalid(Diagnostic { file: file_name.to_owned(), line: Some(line), column: None, field: String::new(), message }));
    }
    let deserializer = serde_norway::Deserializer::from_str(text);
    let raw: RawScenario = serde_path_to_error::deserialize(deserializer).map_err(|err| {
        let mut path: Vec<Seg> = err
            .path()
            .iter()
            .filter_map(|segment| match segment {
                Segment::Seq { index } => Some(Seg::Index(*index)),
                Segment::Map { key } => Some(Seg::Key(key.clone())),
                Segment::Enum { variant } => Some(Seg::Key(variant.clone())),
                // `?` marks a position serde could not name (e.g. a YAML syntax error).
                Segment::Unknown => None,
            })
            .collect();
        let mut diagnostic = from_yaml_error(err.inner(), file_name);
        // For an unknown key the path ends in that key; the message already names it, so the
        // field shown is the map that holds it (`script[3].assistant[0]: unknown field `txt``).
        if let Some(Seg::Key(last)) = path.last()
            && diagnostic.message.starts_with(&format!("unknown field `{last}`")) {
                path.pop();
            }
        diagnostic.field = path_string(&path);
        ScenarioError::Invalid(diagnostic)
    })?;
    check(raw, file_name).map_err(|problem| {
        let (line, column) = locate(text, &problem.path).unzip();
        ScenarioError::Invalid(Diagnostic {
            file: file_name.to_owned(),
            line,
            column,
            field: path_string(&problem.path),
            message: problem.message,
        })
    })
}

/// [`parse_scenario`] of a scenario held as a JSON document (a recorded session's workload,
/// `replay::workload`), without writing it out and reading it back as YAML: the document is
/// deserialized directly. A valid document gives the scenario the text would (JSON is YAML, and
/// every value type reads the same visitor calls from both; tested on every shipped workload);
/// anything the direct reading refuses, or a document nested deeper than the text check allows,
/// goes through the text, so errors are the text's, with their lines and columns.
pub fn parse_scenario_document(document: &serde_json::Value, file_name: &str) -> Result<Scenario, ScenarioError> {
    // The text check counts a one-line JSON document's nesting plus its line's level.
    if json_depth(document) < MAX_YAML_DEPTH
        && let Ok(raw) = <RawScenario as serde::Deserialize>::deserialize(document)
        && let Ok(scenario) = check(raw, file_name)
    {
        return Ok(scenario);
    }
    parse_scenario(&serde_json::to_string(document).expect("a JSON value serializes"), file_name)
}

/// The scenario of a document made of `head` (every key but `script`) and the script whose steps
/// deserialize to `script`, as [`parse_scenario_document`] reads that document where it reads it
/// directly: the head deserialized, the steps put in, the whole checked. The caller vouches
/// that the script nests less than [`MAX_YAML_DEPTH`] levels in the document. `None` where the
/// direct reading refuses it: [`parse_scenario_document`] of the document then says why.
pub(crate) fn scenario_of_parts(head: &serde_json::Value, script: Vec<super::raw::RawStep>, file_name: &str) -> Option<Scenario> {
    if head.get("script").is_some() || json_depth(head) >= MAX_YAML_DEPTH {
        return None;
    }
    let mut raw = <RawScenario as serde::Deserialize>::deserialize(head).ok()?;
    raw.script = script;
    check(raw, file_name).ok()
}

/// Levels of arrays and objects in `value` (a scalar is 0).
pub(crate) fn json_depth(value: &serde_json::Value) -> usize {
    match value {
        serde_json::Value::Array(items) => 1 + items.iter().map(json_depth).max().unwrap_or(0),
        serde_json::Value::Object(map) => 1 + map.values().map(json_depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// Splits a serde_norway error into our parts. Its Display is `<its path>: <message> at line L
/// column C`; we print the position and the path ourselves, so both are cut from the message.
fn from_yaml_error(err: &serde_norway::Error, file_name: &str) -> Diagnostic {
    let location = err.location();
    let mut message = err.to_string();
    if let Some(loc) = &location {
        let suffix = format!(" at line {} column {}", loc.line(), loc.column());
        if let Some(cut) = message.find(&suffix) {
            message.replace_range(cut..cut + suffix.len(), "");
        }
    }
    // serde_norway prefixes its own path (`script[3].assistant[0]: ...`). A path has no spaces,
    // while every message starts with words separated by spaces, so a space-free head before
    // the first ": " is the path.
    if let Some((head, rest)) = message.split_once(": ")
        && !head.is_empty() && !head.contains(' ') && !head.contains('`') {
            message = rest.to_owned();
        }
    Diagnostic {
        file: file_name.to_owned(),
        line: location.as_ref().map(|l| l.line()),
        column: location.as_ref().map(|l| l.column()),
        field: String::new(),
        message: crate::input::cap_message(&message),
    }
}
