//! Whether a recorded turn may have changed the project's working tree.
//!
//! From 2.1.200 the client renders the conversation start (`messages[0]`: CLAUDE.md and the
//! git status of the project) anew for a new prompt. What the record shows is that it is
//! rendered *differently* only when the project changed since the previous prompt: in d847
//! (2.1.215) the four prompts inside the TTL with no side entry to read (no stop summary)
//! fell to the prefix level after a turn that edited files of the project (#63, #157: Edit
//! inside the project; #211: files written by Bash) and read through the previous prompt after
//! the one turn that did not (#168: the previous turn edited a file in the user's home and ran
//! a script that built and removed its own binary). The record does not carry the git status,
//! so this reads it from what the turn did: a tool use that writes (Edit, Write, MultiEdit,
//! NotebookEdit) a path inside the project, a Bash command that writes (below), a subagent
//! launched (its edits are in another lane), or an `edited_text_file` record of a file inside
//! the project (a change made outside the conversation).
//!
//! A Bash command counts when, outside quotes and heredoc bodies, it redirects output (`>`,
//! `>>`) to a file other than `/dev/null` inside the project or relative to it, or runs a
//! command that writes files (`sed -i`, `perl -i`, `tee`, `mv`, `cp`, `touch`, `mkdir`, a
//! Go or shell formatter's `-w`, any `--write`/`--fix`, a mutating `git` subcommand). `rm` and build outputs
//! (`go build -o`) are not counted: they are how a command cleans up what it built (d847
//! #165–#167), which leaves the status as it was. A reading of the text, not an execution:
//! where it is wrong the start is re-rendered or kept one prompt too many.

use serde_json::Value;

/// `path` normalized for a prefix comparison: lower case, `/` separators, a drive letter as
/// the `/x/` an MSYS shell writes it as.
fn normalize(path: &str) -> String {
    let mut p = path.trim().replace('\\', "/").to_lowercase();
    let bytes = p.as_bytes();
    if bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':' {
        p = format!("/{}{}", &p[..1], &p[2..]);
    }
    p.trim_end_matches('/').to_owned()
}

/// The project's directory as [`inside`] compares paths with it.
pub fn project_dir(cwd: Option<&str>) -> Option<String> {
    cwd.map(normalize).filter(|p| !p.is_empty())
}

/// `path` is inside `project` (a relative path is: it is taken from the project's directory or
/// below it; with no project known, every path is).
fn inside(path: &str, project: Option<&str>) -> bool {
    let p = normalize(path);
    let absolute = p.starts_with('/') || p.starts_with('~') || p.starts_with('$');
    if !absolute {
        return true;
    }
    project.is_none_or(|dir| p == dir || p.starts_with(&format!("{dir}/")))
}

/// A tool use of the main lane may have changed the project's working tree.
pub fn tool_use_changes_tree(name: &str, input: &Value, project: Option<&str>) -> bool {
    let field = |key: &str| input.get(key).and_then(Value::as_str);
    match name {
        "Edit" | "Write" | "MultiEdit" => field("file_path").is_none_or(|p| inside(p, project)),
        "NotebookEdit" => field("notebook_path").is_none_or(|p| inside(p, project)),
        "Agent" | "Task" => true,
        "Bash" => field("command").is_some_and(|c| bash_writes(c, project)),
        _ => false,
    }
}

/// An `edited_text_file` record names a file inside the project.
pub fn edited_file_in_project(payload: &Value, project: Option<&str>) -> bool {
    payload.get("filename").and_then(Value::as_str).is_some_and(|p| inside(p, project))
}

/// The command's text outside heredoc bodies and quotes (quoted spans become one space).
fn unquoted(command: &str) -> String {
    let mut kept = String::new();
    for line in command.lines() {
        kept.push_str(line);
        kept.push('\n');
        if line.contains("<<") {
            break;
        }
    }
    let mut out = String::with_capacity(kept.len());
    let mut quote = None;
    for c in kept.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                out.push(' ');
            }
            None => out.push(c),
        }
    }
    out
}

/// Commands (first word of a simple command) that write files whatever their arguments.
const WRITING_COMMANDS: [&str; 5] = ["tee", "mv", "cp", "touch", "mkdir"];
/// Formatters whose `-w` rewrites the files they are given.
const FORMATTERS_W: [&str; 4] = ["gofmt", "goimports", "gofumpt", "shfmt"];
/// `git` subcommands that change the status or the recent commits.
const GIT_WRITES: [&str; 15] =
    ["add", "commit", "reset", "checkout", "switch", "restore", "apply", "stash", "rm", "mv", "merge", "rebase", "cherry-pick", "pull", "revert"];

/// A Bash command writes files of the project (see the module doc).
pub fn bash_writes(command: &str, project: Option<&str>) -> bool {
    let text = unquoted(command);
    if redirects_into_project(&text, project) {
        return true;
    }
    text.split(['\n', ';', '|', '&', '(', ')']).any(|simple| {
        let words: Vec<&str> = simple.split_whitespace().collect();
        let Some(&first) = words.first() else { return false };
        let command = first.rsplit('/').next().unwrap_or(first);
        let has = |flag: &str| words.iter().skip(1).any(|w| *w == flag);
        match command {
            "sed" | "perl" => words.iter().skip(1).any(|w| w.starts_with("-i")),
            "git" => words.iter().skip(1).find(|w| !w.starts_with('-')).is_some_and(|sub| GIT_WRITES.contains(sub)),
            c if WRITING_COMMANDS.contains(&c) => true,
            c if FORMATTERS_W.contains(&c) => has("-w"),
            _ => has("--write") || has("--fix"),
        }
    })
}

/// An output redirection (`>`, `>>`, `&>`) whose target is a file inside the project.
fn redirects_into_project(text: &str, project: Option<&str>) -> bool {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'>' {
            i += 1;
            continue;
        }
        // `->`, `=>`, `<>` are not redirections of a shell command line.
        if i > 0 && matches!(bytes[i - 1], b'-' | b'=' | b'<') {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        if bytes.get(j) == Some(&b'>') {
            j += 1;
        }
        if bytes.get(j) == Some(&b'&') {
            // `>&2`: a descriptor, not a file.
            i = j + 1;
            continue;
        }
        while bytes.get(j).is_some_and(u8::is_ascii_whitespace) && bytes[j] != b'\n' {
            j += 1;
        }
        let end = text[j..].find(|c: char| c.is_whitespace() || matches!(c, ';' | '|' | '&' | ')')).map_or(text.len(), |k| j + k);
        let target = &text[j..end];
        if !target.is_empty() && target != "/dev/null" && !target.eq_ignore_ascii_case("nul") && inside(target, project) {
            return true;
        }
        i = end.max(i + 1);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const PROJECT: Option<&str> = Some("/d/oh-my-posh");

    #[test]
    fn edits_count_inside_the_project_only() {
        let project = project_dir(Some("D:\\oh-my-posh"));
        let project = project.as_deref();
        assert_eq!(project, PROJECT);
        assert!(tool_use_changes_tree("Edit", &json!({"file_path": "D:\\oh-my-posh\\src\\terminal\\writer.go"}), project));
        assert!(!tool_use_changes_tree("Edit", &json!({"file_path": "C:\\Users\\jande\\.posh.omp.jsonc"}), project));
        assert!(tool_use_changes_tree("Write", &json!({"file_path": "notes.md"}), project));
        assert!(tool_use_changes_tree("Agent", &json!({}), project));
        assert!(!tool_use_changes_tree("Read", &json!({"file_path": "D:\\oh-my-posh\\a.go"}), project));
        assert!(edited_file_in_project(&json!({"filename": "D:\\oh-my-posh\\website\\docs\\a.mdx"}), project));
        assert!(!edited_file_in_project(&json!({"filename": "C:\\Users\\jande\\.posh.omp.jsonc"}), project));
    }

    #[test]
    fn bash_writes_read_from_the_command_text() {
        let writes = |c: &str| bash_writes(c, PROJECT);
        assert!(writes("cat > terminal/gradient_bench_test.go << 'EOF'\npackage terminal\nEOF"));
        assert!(writes("sed -i 's/a/b/' terminal/x.go"));
        assert!(writes("cd /d/oh-my-posh && git commit -m \"feat: x > y\""));
        assert!(writes("gofmt -w . && go build ./..."));
        assert!(writes("echo hi >> /d/oh-my-posh/notes.txt"));
        assert!(!writes("go test ./... 2>&1 | tail -60"));
        assert!(!writes("gofmt -l . 2>/dev/null; go vet ./color/..."));
        assert!(!writes("git status --short && git log --oneline -4"));
        assert!(!writes("grep -n \"a > b\" src/x.go"));
        assert!(!writes("echo x > /tmp/out.txt"));
        assert!(!writes("python /c/Users/j/scratchpad/validate.py && cd src && go build -o ../scratch-omp.exe . && ../scratch-omp.exe print right | cat -v && cd .. && rm scratch-omp.exe"));
        assert!(!writes("python - << 'EOF'\nif a > b: open('x','w')\nEOF"));
    }
}
