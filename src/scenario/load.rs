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
                scenario.world.files.insert(file.to_owned(), entry.contents.clone().into());
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
/// crossed and a message. One pass, no parsing: block levels by indentation and `- ` entries,
/// flow levels by `[`/`{` outside quotes.
pub fn check_yaml_depth(text: &str) -> Result<(), (usize, String)> {
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    for (i, line) in text.lines().enumerate() {
        let content = line.trim_start_matches(' ');
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        if flow == 0 {
            let indent = line.len() - content.len();
            while indents.last().is_some_and(|&top| top >= indent) {
                indents.pop();
            }
            indents.push(indent);
        }
        let mut rest = content;
        let mut dashes = 0;
        while let Some(after) = rest.strip_prefix("- ").or_else(|| rest.strip_prefix("-\t")) {
            dashes += 1;
            rest = after.trim_start_matches(' ');
        }
        let (mut quote, mut deepest_flow) = (None::<char>, flow);
        for c in rest.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => quote = Some(c),
                (None, '#') => break,
                (None, '[' | '{') => {
                    flow += 1;
                    deepest_flow = deepest_flow.max(flow);
                }
                (None, ']' | '}') => flow = flow.saturating_sub(1),
                _ => {}
            }
        }
        let depth = indents.len() + dashes + deepest_flow;
        if depth > MAX_YAML_DEPTH {
            return Err((i + 1, format!("nested {depth} levels deep, more than the {MAX_YAML_DEPTH} a scenario or strategy may have")));
        }
    }
    Ok(())
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

/// Levels of arrays and objects in `value` (a scalar is 0).
fn json_depth(value: &serde_json::Value) -> usize {
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
