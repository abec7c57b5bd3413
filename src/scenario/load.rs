//! Reading a scenario file: YAML → raw types (serde reports unknown keys and wrong types with
//! their position) → checks (which report a field path, located afterwards).

use std::path::Path;

use serde_path_to_error::Segment;

use super::check::{Seg, check, path_string};
use super::error::{Diagnostic, ScenarioError};
use super::locate::locate;
use super::raw::RawScenario;
use super::schema::Scenario;

/// Loads and validates a scenario file.
pub fn load_scenario(path: impl AsRef<Path>) -> Result<Scenario, ScenarioError> {
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
    let mut scenario = parse_scenario(&text, &path.display().to_string())?;
    let base = path.parent().unwrap_or(Path::new("."));
    for mount in scenario.world.mount.clone() {
        let real = base.join(&mount.from);
        let mut fs = crate::world::VirtualFs::new();
        fs.load_from_dir(&real, &mount.at, &crate::world::Clock::new(0))
            .map_err(|e| ScenarioError::Io { path: real.clone(), source: std::io::Error::other(e.to_string()) })?;
        for (file, entry) in fs.files() {
            if !scenario.world.files.contains_key(file) {
                scenario.world.files.insert(file.to_owned(), entry.contents.clone());
            }
        }
    }
    Ok(scenario)
}

/// Parses and validates scenario text; `file_name` is used in messages only.
pub fn parse_scenario(text: &str, file_name: &str) -> Result<Scenario, ScenarioError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
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
