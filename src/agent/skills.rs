//! Skills: bundled ones, SKILL.md directories over the virtual filesystem, and the
//! `skill_listing` text within its budget (reference layers-1-5 §5.2, §6.1–6.2).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::agent::instructions::{ancestors_outermost_first, split_frontmatter};
use crate::world::{FragmentAnswers, VirtualFs};

/// A skill the Skill tool can run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    /// The listing name: the directory name (`{plugin}:{dir}` for plugin skills).
    pub name: String,
    pub description: String,
    pub when_to_use: Option<String>,
    pub dir: String,
    pub body: String,
    pub bundled: bool,
    /// `paths` frontmatter: listed only once a matching file is touched.
    pub paths: Vec<String>,
    /// Every frontmatter field of the reference, as read.
    pub fields: SkillFields,
    /// Frontmatter keys the reference does not know, kept as read.
    pub extra: BTreeMap<String, Value>,
    /// The frontmatter was not valid YAML and was read line by line (`key: value`).
    pub lenient: bool,
}

/// The frontmatter fields of `parseSkillFrontmatterFields`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SkillFields {
    /// `name` → displayName.
    pub display_name: Option<String>,
    /// `description` as written (the listing falls back to the first body line).
    pub description: Option<String>,
    pub allowed_tools: Vec<String>,
    pub argument_hint: Option<String>,
    pub arguments: Option<Value>,
    pub version: Option<String>,
    /// `model`; `inherit` → none.
    pub model: Option<String>,
    pub disable_model_invocation: bool,
    /// Default true.
    pub user_invocable: bool,
    /// `hooks` (the settings shape), registered as session hooks when the skill is invoked.
    pub hooks: Option<Value>,
    /// `context: fork`.
    pub context: Option<String>,
    pub agent: Option<String>,
    pub effort: Option<String>,
    pub shell: Option<String>,
}

const KNOWN_KEYS: [&str; 16] = [
    "name",
    "description",
    "when_to_use",
    "allowed-tools",
    "argument-hint",
    "arguments",
    "version",
    "model",
    "disable-model-invocation",
    "user-invocable",
    "hooks",
    "context",
    "agent",
    "effort",
    "shell",
    "paths",
];

impl Skill {
    /// Whether the Skill tool lists it (`getSkillToolCommands`): model invocation allowed.
    pub fn listed(&self) -> bool {
        !self.fields.disable_model_invocation
    }

    /// What the Skill tool injects (`getPromptForCommand`): the base-directory line, then the
    /// body with `${CLAUDE_SKILL_DIR}` and `${CLAUDE_SESSION_ID}` replaced.
    pub fn invocation_body(&self, session_id: &str) -> String {
        self.body.replace("${CLAUDE_SKILL_DIR}", &self.dir).replace("${CLAUDE_SESSION_ID}", session_id)
    }
}

/// The bundled skills of 2.1.88 by name, in listing order, with our own descriptions, sized so
/// that the listing is the client's size (989 characters with its reminder wrapper).
pub fn bundled_skills() -> Vec<Skill> {
    BUNDLED_SKILLS.clone()
}

/// [`bundled_skills`], made once: the agent lists its skills at every step.
pub static BUNDLED_SKILLS: std::sync::LazyLock<Vec<Skill>> = std::sync::LazyLock::new(|| {
    [
        (
            "update-config",
            "Change how Claude Code is set up through its settings.json files: permissions, hooks, environment variables and more. Use it when the user wants something to happen automatically, or asks to allow, deny or configure a behaviour.",
        ),
        (
            "simplify",
            "Look over the code that was changed recently for duplicated logic, needless complexity and wasted work, then fix the problems it finds. Use it after a feature is finished, or when the user asks for a cleanup pass.",
        ),
        (
            "loop",
            "Run a prompt or slash command again and again on a fixed interval (ten minutes by default) until it is stopped. Use it to poll for a status, keep an eye on a long job, or repeat a check.",
        ),
        (
            "claude-api",
            "Write programs against the Claude API or the Anthropic SDKs: messages, streaming, tool use, agents and prompt caching. Use it when the code imports an Anthropic SDK or the user asks to build an app on Claude.",
        ),
    ]
    .into_iter()
    .map(|(name, description)| Skill {
        name: name.into(),
        description: description.into(),
        when_to_use: None,
        dir: String::new(),
        body: format!("Follow the {name} procedure step by step."),
        bundled: true,
        paths: Vec::new(),
        fields: SkillFields { user_invocable: true, ..SkillFields::default() },
        extra: BTreeMap::new(),
        lenient: false,
    })
    .collect()
});

/// The skill directories in the reference's source order: managed `{managed}/.claude/skills`,
/// user `{config_home}/skills`, then `.claude/skills` of every directory from the cwd upward.
pub fn skill_roots(config_home: &str, cwd: &str, managed_dir: &str) -> Vec<String> {
    let mut dirs = vec![format!("{managed_dir}/.claude/skills"), format!("{config_home}/skills")];
    for dir in ancestors_outermost_first(cwd).into_iter().rev() {
        dirs.push(format!("{}/.claude/skills", dir.trim_end_matches('/')));
    }
    dirs
}

/// Loads `{root}/*/SKILL.md` of every root in order; the first skill of a name wins.
pub fn load_skills_from(fs: &VirtualFs, roots: &[String], prefix: Option<&str>) -> Vec<Skill> {
    Vec::clone(&load_skills_from_shared(fs, roots, prefix))
}

/// [`load_skills_from`] as kept by the fs: shared, not copied.
pub fn load_skills_from_shared(fs: &VirtualFs, roots: &[String], prefix: Option<&str>) -> std::sync::Arc<Vec<Skill>> {
    // The agent lists its skills at every step; between two changes of the fs they are those
    // it read the step before.
    let key = derived_key(if prefix.is_some() { "skills with prefix" } else { "skills" }, prefix.into_iter().chain(roots.iter().map(String::as_str)));
    fs.derived_by_reads(&key, |fs| std::sync::Arc::new(read_skills_from(fs, roots, prefix)))
}

/// A key of the fs's derived values ([`VirtualFs::derived_by_reads`]): `tag`, then each part
/// with its length before it, so no two lists of parts (nor two tags here) give one key.
/// Written part by part: the agent asks at every step, and `{:?}` escapes every character.
fn derived_key<'a>(tag: &str, parts: impl Iterator<Item = &'a str> + Clone) -> String {
    let mut digits = itoa::Buffer::new();
    let mut key = String::with_capacity(tag.len() + 1 + parts.clone().map(|part| part.len() + 8).sum::<usize>());
    key.push_str(tag);
    key.push('|');
    for part in parts {
        key.push_str(digits.format(part.len()));
        key.push(':');
        key.push_str(part);
    }
    key
}

/// [`load_skills_from`] read afresh.
fn read_skills_from(fs: &crate::world::Reads<'_>, roots: &[String], prefix: Option<&str>) -> Vec<Skill> {
    let mut out: Vec<Skill> = Vec::new();
    for root in roots {
        let Ok(entries) = fs.list_dir(root) else { continue };
        for entry in entries.into_iter().filter(|e| e.is_dir) {
            let path = format!("{}/SKILL.md", entry.path);
            let Ok(text) = fs.read(&path) else { continue };
            let name = match prefix {
                Some(p) => format!("{p}:{}", entry.name),
                None => entry.name.clone(),
            };
            if out.iter().any(|s| s.name == name) {
                continue;
            }
            out.push(parse_skill(&name, &entry.path, text));
        }
    }
    out
}

/// The path the client records and shows for an invoked skill (its `invoked_skills`
/// attachment, "Path: …"): the skill's settings source before its name, `{source}:{name}`
/// (2.1.88 builds it so for every prompt command it runs, a Skill call's included; a 2.1.232
/// record shows `userSettings:lore-commit`). The source follows where the skill was loaded
/// from ([`skill_roots`]): bundled, managed (`policySettings`), the user's config home
/// (`userSettings`), a plugin (a `{plugin}:` name), else the project (`projectSettings`).
pub fn invoked_path(skill: &Skill, config_home: &str) -> String {
    let under = |root: &str| skill.dir.starts_with(&format!("{}/", root.trim_end_matches('/')));
    let source = if skill.bundled {
        "bundled"
    } else if under(&format!("{}/.claude/skills", crate::agent::instructions::MANAGED_DIR)) {
        "policySettings"
    } else if under(&format!("{config_home}/skills")) {
        "userSettings"
    } else if skill.name.contains(':') {
        "plugin"
    } else {
        "projectSettings"
    };
    format!("{source}:{}", skill.name)
}

/// [`invoked_path`] for a skill or slash command a recorded client expanded (a workload's
/// `attachment.skill`): a skill's body opens with its base directory, which names the source.
/// The directory and the `cwd` are compared as [`comparable_path`] writes them (a Windows or
/// MSYS client's `C:\Users\u`, `c:/Users/u`, `/c/Users/u` and `/cygdrive/c/Users/u` are one
/// directory), and the sources are tried in this order:
/// 1. `plugin`: a `plugins` directory in the path *below* the project (the whole path when the
///    skill is outside it): plugins live in the config home's `plugins/` (`~/.claude/plugins/
///    cache/…`), which is below the project when the project is the home directory, and a
///    project whose own path has a `plugins` directory keeps its skills;
/// 2. `projectSettings`: under the project's `cwd`;
/// 3. `userSettings`: a `.claude/skills` elsewhere (the user's).
///
/// A command's body names no directory, and neither does the record, nor does a skill directory
/// of none of those kinds: `None`, so the restored text has no path line rather than a made-up
/// one.
pub fn recorded_invoked_path(name: &str, body: &str, cwd: &str) -> Option<String> {
    let first = body.lines().next()?;
    let dir = comparable_path(first.strip_prefix("Base directory for this skill:")?);
    let cwd = comparable_path(cwd);
    let in_project = cwd.len() > 1 && (dir == cwd || dir.starts_with(&format!("{cwd}/")));
    let below_project = if in_project { &dir[cwd.len()..] } else { dir.as_str() };
    let source = if below_project.contains("/plugins/") {
        "plugin"
    } else if in_project {
        "projectSettings"
    } else if dir.contains("/.claude/skills/") {
        "userSettings"
    } else {
        return None;
    };
    Some(format!("{source}:{name}"))
}

/// A path as [`recorded_invoked_path`] compares it: [`msys_path`]'s spelling in lower case
/// (Windows and macOS clients' file systems ignore case).
pub fn comparable_path(path: &str) -> String {
    msys_path(path).to_lowercase()
}

/// A path in one spelling whatever the client that wrote it: `/` separators, one between parts,
/// none at the end, and a Windows drive as MSYS writes it (`C:\x`, `c:/x`, `\\?\C:\x`,
/// `/cygdrive/c/x` → `/c/x`, the drive letter in lower case); the rest keeps its case. A POSIX
/// path stays as it is but for repeated and trailing separators. How a recorded `cwd` enters a
/// workload (`world.cwd`, which the scenario wants absolute) and, in lower case, how a skill's
/// directory is compared with it ([`comparable_path`]).
pub fn msys_path(path: &str) -> String {
    let path = path.trim().replace('\\', "/");
    let strip = |path: &str, prefix: &str| path.get(..prefix.len()).filter(|p| p.eq_ignore_ascii_case(prefix)).map(|_| path[prefix.len()..].to_owned());
    let path = strip(&path, "//?/").unwrap_or(path);
    let path = strip(&path, "/cygdrive/").map_or(path, |rest| format!("/{rest}"));
    let bytes = path.as_bytes();
    let path = if bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':' && (bytes.len() == 2 || bytes[2] == b'/') {
        ["/", &path[..1].to_ascii_lowercase(), "/", &path[2..]].concat()
    } else {
        path
    };
    let mut out = String::with_capacity(path.len());
    for part in path.split('/').filter(|p| !p.is_empty()) {
        out.push('/');
        out.push_str(part);
    }
    if !path.starts_with('/') && !out.is_empty() {
        out.remove(0);
    }
    out
}

/// Whether a tool call's path is spelled as a Windows client writes it: a drive (`D:\x`,
/// `d:/x`), a `\\?\` or UNC prefix, or a backslash separator (`src\x.go`). A POSIX
/// client's path never is (a backslash in a POSIX file name is left to that client's rare user).
pub fn is_windows_path(path: &str) -> bool {
    let bytes = path.trim_start().as_bytes();
    path.contains('\\') || (bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':')
}

/// A path a recorded tool call names (`file_path`, `path`, a file's `filePath`) as the agent's
/// filesystem and cwd spell it: a Windows spelling as [`msys_path`] writes it (`D:\omp\src\a.go`
/// → `/d/omp/src/a.go`, under the `world.cwd` a Windows recording gets), any other as given, so
/// that a POSIX session's paths stay byte for byte what they were.
pub fn tool_path(path: &str) -> std::borrow::Cow<'_, str> {
    if is_windows_path(path) { std::borrow::Cow::Owned(msys_path(path)) } else { std::borrow::Cow::Borrowed(path) }
}

/// Which file a recorded path names, for comparing two of them (the replay's file state, the
/// loss judge's re-reads): a Windows spelling as [`comparable_path`] writes it (`D:\x` and `d:/X`
/// are one file: the client's file system ignores case), any other as given.
pub fn file_key(path: &str) -> std::borrow::Cow<'_, str> {
    if is_windows_path(path) { std::borrow::Cow::Owned(comparable_path(path)) } else { std::borrow::Cow::Borrowed(path) }
}

/// User and project skills (see [`skill_roots`]).
pub fn load_skills(fs: &VirtualFs, config_home: &str, cwd: &str) -> Vec<Skill> {
    Vec::clone(&load_skills_shared(fs, config_home, cwd))
}

/// [`load_skills`] as kept by the fs: shared, not copied.
pub fn load_skills_shared(fs: &VirtualFs, config_home: &str, cwd: &str) -> std::sync::Arc<Vec<Skill>> {
    // Kept by home and cwd (quoted in the key, so no two pairs share one): the roots they name
    // are not worked out again at every step.
    fs.derived_by_reads(&derived_key("skills of", [config_home, cwd].into_iter()), |fs| {
        std::sync::Arc::new(read_skills_from(fs, &skill_roots(config_home, cwd, crate::agent::instructions::MANAGED_DIR), None))
    })
}

/// The `.claude/skills` directories between a touched file and the cwd (the cwd excluded),
/// deepest first (`discoverSkillDirsForPaths`).
pub fn nested_skill_dirs(fs: &VirtualFs, file: &str, cwd: &str) -> Vec<String> {
    const SKILLS: &str = "/.claude/skills";
    let cwd = cwd.trim_end_matches('/');
    let mut out = Vec::new();
    let inside = |dir: &str| dir.strip_prefix(cwd).is_some_and(|rest| rest.starts_with('/'));
    let mut dir = file.rsplit_once('/').map_or("", |(d, _)| d);
    // (One buffer for every candidate: the agent asks this of every file a reply touches.)
    let mut candidate = String::with_capacity(dir.len() + SKILLS.len());
    while dir.len() > cwd.len() && inside(dir) {
        candidate.clear();
        candidate.push_str(dir);
        candidate.push_str(SKILLS);
        if fs.is_dir(&candidate) {
            out.push(candidate.clone());
        }
        dir = dir.rsplit_once('/').map_or("", |(d, _)| d);
    }
    out
}

/// The directories [`nested_skill_dirs`] names, kept by the directory of `file` (each answer
/// with the cwd it was found under) in `kept` ([`new_nested_skill_dirs_kept`]): only the files
/// and explicit directories under a `.claude/skills` directory bear on it, and a step touches
/// the same few directories again (debug builds look again and compare).
pub fn nested_skill_dirs_kept(fs: &VirtualFs, file: &str, cwd: &str, kept: &mut FragmentAnswers<(String, Vec<String>)>) -> Vec<String> {
    let dir = file.rsplit_once('/').map_or("", |(d, _)| d);
    let answers = fs.answers_kept(kept);
    if let Some((under, dirs)) = answers.get(dir)
        && under == cwd
    {
        debug_assert_eq!(*dirs, nested_skill_dirs(fs, file, cwd), "the kept .claude/skills directories above {file} differ from looking");
        return dirs.clone();
    }
    let dirs = nested_skill_dirs(fs, file, cwd);
    answers.insert(dir.to_owned(), (cwd.to_owned(), dirs.clone()));
    dirs
}

/// What [`nested_skill_dirs_kept`] keeps its answers in: a change of a path holding
/// `/.claude/skills` (where every directory it looks for and everything in one lies) drops them.
pub fn new_nested_skill_dirs_kept() -> FragmentAnswers<(String, Vec<String>)> {
    FragmentAnswers::new("/.claude/skills")
}

/// Frontmatter as a JSON object: YAML first; when YAML rejects it (an unquoted `: ` inside a
/// value is common in hand-written files), a lenient `key: value` line reading. Never fails.
pub fn read_frontmatter(frontmatter: &str) -> (serde_json::Map<String, Value>, bool) {
    match serde_norway::from_str::<Value>(frontmatter) {
        Ok(Value::Object(map)) => (map, false),
        Ok(Value::Null) => (serde_json::Map::new(), false),
        _ => {
            let mut map = serde_json::Map::new();
            let mut last: Option<String> = None;
            for line in frontmatter.lines() {
                if line.trim().is_empty() || line.trim_start().starts_with('#') {
                    continue;
                }
                let indented = line.starts_with(' ') || line.starts_with('\t');
                if let (true, Some(key)) = (indented, &last) {
                    // A continuation line or a list item of the previous key.
                    let item = line.trim();
                    let entry = map.entry(key.clone()).or_insert(Value::Null);
                    if let Some(item) = item.strip_prefix("- ") {
                        match entry {
                            Value::Array(items) => items.push(Value::String(unquote(item))),
                            _ => *entry = Value::Array(vec![Value::String(unquote(item))]),
                        }
                    } else if let Value::String(s) = entry {
                        if !s.is_empty() {
                            s.push(' ');
                        }
                        s.push_str(item);
                    } else if entry.is_null() {
                        *entry = Value::String(item.to_owned());
                    }
                    continue;
                }
                let Some((key, value)) = line.split_once(':') else { continue };
                let key = key.trim().to_owned();
                let value = value.trim();
                let value = match value {
                    "" | "|" | ">" | "|-" | ">-" => Value::Null,
                    "true" => Value::Bool(true),
                    "false" => Value::Bool(false),
                    other => Value::String(unquote(other)),
                };
                map.insert(key.clone(), value);
                last = Some(key);
            }
            (map, true)
        }
    }
}

fn unquote(text: &str) -> String {
    let t = text.trim();
    for q in ['"', '\''] {
        if t.len() >= 2 && t.starts_with(q) && t.ends_with(q) {
            return t[1..t.len() - 1].to_owned();
        }
    }
    t.to_owned()
}

pub(crate) fn string_of(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

pub(crate) fn bool_of(value: Option<&Value>, default: bool) -> bool {
    match value {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => matches!(s.as_str(), "true" | "yes" | "on"),
        _ => default,
    }
}

pub(crate) fn list_of(value: Option<&Value>) -> Vec<String> {
    match value {
        Some(Value::String(s)) => s.split(',').map(|p| p.trim().to_owned()).filter(|p| !p.is_empty()).collect(),
        Some(Value::Array(items)) => items.iter().filter_map(|v| string_of(Some(v))).collect(),
        _ => Vec::new(),
    }
}

/// One SKILL.md: the directory name is the skill name; `description` falls back to the first
/// line of the body. Unknown keys are kept in `extra`; nothing here is fatal.
pub fn parse_skill(name: &str, dir: &str, text: &str) -> Skill {
    let (frontmatter, body) = split_frontmatter(text);
    let (meta, lenient) = frontmatter.as_deref().map(read_frontmatter).unwrap_or_default();
    let get = |key: &str| string_of(meta.get(key));
    let fields = SkillFields {
        display_name: get("name"),
        description: get("description"),
        allowed_tools: list_of(meta.get("allowed-tools")),
        argument_hint: get("argument-hint"),
        arguments: meta.get("arguments").cloned(),
        version: get("version"),
        model: get("model").filter(|m| m != "inherit"),
        disable_model_invocation: bool_of(meta.get("disable-model-invocation"), false),
        user_invocable: bool_of(meta.get("user-invocable"), true),
        hooks: meta.get("hooks").filter(|h| h.is_object()).cloned(),
        context: get("context"),
        agent: get("agent"),
        effort: get("effort"),
        shell: get("shell"),
    };
    let description = fields
        .description
        .clone()
        .unwrap_or_else(|| body.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim_start_matches('#').trim().to_owned());
    let extra = meta.iter().filter(|(k, _)| !KNOWN_KEYS.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
    Skill {
        name: name.to_owned(),
        description,
        when_to_use: get("when_to_use"),
        dir: dir.to_owned(),
        body: body.trim().to_owned(),
        bundled: false,
        paths: list_of(meta.get("paths")),
        fields,
        extra,
        lenient,
    }
}

/// `formatCommandsWithinBudget`: `- {name}: {description[ - when_to_use]}`, each description at
/// most `description_max` characters; when the total exceeds `budget`, non-bundled entries share
/// what is left, and fall back to names only below 20 characters each.
pub fn format_listing(skills: &[&Skill], budget: usize, description_max: usize) -> String {
    let describe = |s: &Skill| {
        let full = match &s.when_to_use {
            Some(w) => format!("{} - {w}", s.description),
            None => s.description.clone(),
        };
        cap(&full, description_max)
    };
    let full: Vec<String> = skills.iter().map(|s| format!("- {}: {}", s.name, describe(s))).collect();
    let total: usize = full.iter().map(|l| l.chars().count()).sum::<usize>() + full.len().saturating_sub(1);
    if total <= budget {
        return full.join("\n");
    }
    let bundled_chars: usize = skills.iter().zip(&full).filter(|(s, _)| s.bundled).map(|(_, l)| l.chars().count()).sum();
    let others: Vec<&&Skill> = skills.iter().filter(|s| !s.bundled).collect();
    let n = others.len().max(1);
    let names: usize = others.iter().map(|s| s.name.chars().count() + 4).sum();
    let room = budget.saturating_sub(bundled_chars + names + skills.len().saturating_sub(1));
    let per = room / n;
    skills
        .iter()
        .zip(&full)
        .map(|(s, line)| {
            if s.bundled {
                line.clone()
            } else if per < 20 {
                format!("- {}", s.name)
            } else {
                format!("- {}: {}", s.name, cap(&describe(s), per))
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn cap(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_skill_is_named_by_its_source_and_a_command_by_none() {
        let path = |body: &str| recorded_invoked_path("x", body, "/Users/u/proj/");
        assert_eq!(path("Base directory for this skill: /Users/u/proj/.claude/skills/x\n\nSteps."), Some("projectSettings:x".to_owned()));
        assert_eq!(path("Base directory for this skill: /Users/u/.claude/skills/x\n\nSteps."), Some("userSettings:x".to_owned()));
        assert_eq!(path("Base directory for this skill: /Users/u/.claude/plugins/cache/p/skills/x"), Some("plugin:x".to_owned()));
        // A sibling directory sharing the project's prefix is not the project.
        assert_eq!(path("Base directory for this skill: /Users/u/project2/.claude/skills/x"), Some("userSettings:x".to_owned()));
        assert_eq!(recorded_invoked_path("x", "Base directory for this skill: D:\\omp\\.claude\\skills\\x", "D:\\omp"), Some("projectSettings:x".to_owned()));
        assert_eq!(path("Base directory for this skill: /Users/u/workspace/loop/skills/x"), None);
        assert_eq!(path("<objective>\nCheck progress.</objective>"), None);
        assert_eq!(path(""), None);
    }

    /// Windows and MSYS spellings of one directory compare equal, on either side.
    #[test]
    fn a_recorded_skill_path_is_compared_across_windows_spellings() {
        for spelling in ["C:\\Users\\u\\proj", "c:/Users/u/proj/", "/c/Users/u/proj", "/cygdrive/c/Users/u/proj", "\\\\?\\C:\\Users\\u\\proj", "C:\\Users\\u\\\\proj\\"] {
            assert_eq!(comparable_path(spelling), "/c/users/u/proj", "{spelling}");
        }
        assert_eq!(comparable_path("relative\\dir"), "relative/dir");
        // The spelling without the case folding (a workload's `world.cwd`): the drive letter as
        // MSYS writes it, the rest as recorded.
        for spelling in ["C:\\Users\\u\\Proj", "c:/Users/u/Proj/", "/c/Users/u/Proj", "/CYGDRIVE/c/Users/u/Proj", "\\\\?\\C:\\Users\\u\\Proj"] {
            assert_eq!(msys_path(spelling), "/c/Users/u/Proj", "{spelling}");
            assert_eq!(comparable_path(spelling), msys_path(spelling).to_lowercase(), "{spelling}");
        }
        assert_eq!(msys_path("/Users/Michael//Code/x/"), "/Users/Michael/Code/x");
        assert_eq!(comparable_path(""), "");
        assert_eq!(comparable_path("/"), "");
        let body = |dir: &str| format!("Base directory for this skill: {dir}\n\n# Steps");
        for cwd in ["C:\\Users\\u\\proj", "/c/Users/u/proj", "c:/users/u/proj"] {
            for dir in ["C:\\Users\\u\\proj\\.claude\\skills\\x", "/c/Users/u/proj/.claude/skills/x", "/cygdrive/c/Users/u/proj/.claude/skills/x"] {
                assert_eq!(recorded_invoked_path("x", &body(dir), cwd), Some("projectSettings:x".to_owned()), "{dir} in {cwd}");
            }
            assert_eq!(recorded_invoked_path("x", &body("C:\\Users\\u\\.claude\\skills\\x"), cwd), Some("userSettings:x".to_owned()));
            assert_eq!(recorded_invoked_path("x", &body("/c/Users/u/.claude/plugins/cache/m/p/1.0/skills/x"), cwd), Some("plugin:x".to_owned()));
        }
    }

    /// The order of the sources: a `plugins` directory below the project first (the plugin
    /// cache is below the project when the project is the home directory), then the project,
    /// then a `.claude/skills` elsewhere; a `plugins` directory in the project's own path does
    /// not make its skills a plugin's.
    #[test]
    fn a_recorded_skill_source_is_tried_plugin_then_project_then_user() {
        let body = |dir: &str| format!("Base directory for this skill: {dir}");
        // The project is the home directory: its plugin cache and its skills are both below it.
        let home = "/Users/u";
        assert_eq!(recorded_invoked_path("x", &body("/Users/u/.claude/plugins/cache/m/p/skills/x"), home), Some("plugin:x".to_owned()));
        assert_eq!(recorded_invoked_path("x", &body("/Users/u/.claude/skills/x"), home), Some("projectSettings:x".to_owned()));
        // A project under a `plugins` directory keeps its own skills, and a plugin below it is one.
        let project = "/Users/u/plugins/proj";
        assert_eq!(recorded_invoked_path("x", &body("/Users/u/plugins/proj/.claude/skills/x"), project), Some("projectSettings:x".to_owned()));
        assert_eq!(recorded_invoked_path("x", &body("/Users/u/plugins/proj/plugins/p/skills/x"), project), Some("plugin:x".to_owned()));
        assert_eq!(recorded_invoked_path("x", &body("/Users/u/.claude/skills/x"), project), Some("userSettings:x".to_owned()));
        // A user's skill whose name is `plugins` is no plugin.
        assert_eq!(recorded_invoked_path("plugins", &body("/Users/u/.claude/skills/plugins"), project), Some("userSettings:plugins".to_owned()));
        // No project (an empty or root cwd) leaves plugin and user skills.
        for cwd in ["", "/"] {
            assert_eq!(recorded_invoked_path("x", &body("/Users/u/.claude/skills/x"), cwd), Some("userSettings:x".to_owned()));
            assert_eq!(recorded_invoked_path("x", &body("/Users/u/.claude/plugins/p/skills/x"), cwd), Some("plugin:x".to_owned()));
        }
    }

    #[test]
    fn an_invoked_skill_is_named_by_where_it_was_loaded_from() {
        let mut skill = parse_skill("x", "/home/u/.claude/skills/x", "");
        assert_eq!(invoked_path(&skill, "/home/u/.claude"), "userSettings:x");
        skill.dir = "/repo/.claude/skills/x".into();
        assert_eq!(invoked_path(&skill, "/home/u/.claude"), "projectSettings:x");
        skill.dir = format!("{}/.claude/skills/x", crate::agent::instructions::MANAGED_DIR);
        assert_eq!(invoked_path(&skill, "/home/u/.claude"), "policySettings:x");
    }
}
