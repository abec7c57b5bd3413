//! Skills: bundled ones, SKILL.md directories over the virtual filesystem, and the
//! `skill_listing` text within its budget (reference layers-1-5 §5.2, §6.1–6.2).

use crate::agent::instructions::{ancestors_outermost_first, split_frontmatter};
use crate::world::VirtualFs;

/// A skill the Skill tool can run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    pub name: String,
    pub description: String,
    pub when_to_use: Option<String>,
    pub dir: String,
    pub body: String,
    pub bundled: bool,
    /// `paths` frontmatter: listed only once a matching file is touched.
    pub paths: Vec<String>,
}

/// The bundled skills of 2.1.88 by name, in listing order, with our own descriptions.
pub fn bundled_skills() -> Vec<Skill> {
    [
        ("update-config", "Change Claude Code settings (permissions, hooks, env) in settings.json files."),
        ("simplify", "Review recently changed code for reuse, quality and efficiency, then fix what it finds."),
        ("loop", "Run a prompt or command again and again on an interval until stopped."),
        ("claude-api", "Build programs on the Claude API or Anthropic SDKs, including agents and tool use."),
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
    })
    .collect()
}

/// Loads `{config_home}/skills/*/SKILL.md`, then `.claude/skills/*/SKILL.md` from the cwd
/// upward; the first skill of a name wins. Unknown frontmatter keys are ignored, never fatal.
pub fn load_skills(fs: &VirtualFs, config_home: &str, cwd: &str) -> Vec<Skill> {
    let mut dirs = vec![format!("{config_home}/skills")];
    for dir in ancestors_outermost_first(cwd).into_iter().rev() {
        dirs.push(format!("{dir}/.claude/skills"));
    }
    let mut out: Vec<Skill> = Vec::new();
    for root in dirs {
        let Ok(entries) = fs.list_dir(&root) else { continue };
        for entry in entries.into_iter().filter(|e| e.is_dir) {
            let path = format!("{}/SKILL.md", entry.path);
            let Ok(text) = fs.read(&path) else { continue };
            if out.iter().any(|s| s.name == entry.name) {
                continue;
            }
            out.push(parse_skill(&entry.name, &entry.path, text));
        }
    }
    out
}

/// One SKILL.md: the directory name is the skill name; `description` falls back to the first
/// line of the body.
pub fn parse_skill(name: &str, dir: &str, text: &str) -> Skill {
    let (frontmatter, body) = split_frontmatter(text);
    let meta: serde_json::Value =
        frontmatter.as_deref().and_then(|f| serde_norway::from_str(f).ok()).unwrap_or(serde_json::Value::Null);
    let get = |key: &str| meta.get(key).and_then(|v| v.as_str()).map(str::to_owned);
    let description = get("description")
        .unwrap_or_else(|| body.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim_start_matches('#').trim().to_owned());
    let paths = match meta.get("paths") {
        Some(serde_json::Value::String(s)) => s.split(',').map(|p| p.trim().to_owned()).filter(|p| !p.is_empty()).collect(),
        Some(serde_json::Value::Array(items)) => items.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect(),
        _ => Vec::new(),
    };
    Skill {
        name: name.to_owned(),
        description,
        when_to_use: get("when_to_use"),
        dir: dir.to_owned(),
        body: body.trim().to_owned(),
        bundled: false,
        paths,
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
