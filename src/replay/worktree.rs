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
//! A Bash command is split as the shell splits it ([`simple_commands`]: quotes, escapes,
//! operators, redirections, heredoc bodies skipped, the lines after them read; a `cd` on the line
//! moves where later relative paths point). It counts when a simple command of it redirects
//! output (`>`, `>>`, `&>`) to a file other than `/dev/null` inside the project or relative to
//! it, or writes files of the project: `sed -i`/`perl -i` (in any option cluster: `-pi`,
//! `-i.bak`) on a file inside, `tee`, `touch` or `mkdir` of a path inside, `cp` to a target
//! inside, `mv` from or to a path inside, a Go or shell formatter's `-w`, any `--write`/`--fix`,
//! a mutating `git` subcommand run in the project (`git -C DIR` or `--work-tree` outside it does
//! not count). `rm` and build outputs (`go build -o`) are not counted: they are how a command
//! cleans up what it built (d847 #165–#167), which leaves the status as it was. A reading of the
//! text, not an execution: where it is wrong the start is re-rendered or kept one prompt too
//! many.

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
        // Relative to the project's root (the session's directory): a path that climbs out of
        // it (`git -C ../other commit`, `cp x ../y`) is outside.
        return !(p == ".." || p.starts_with("../"));
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

/// One simple command of a command line, as the shell would split it: its words (quotes
/// removed), the targets of its output redirections, and the directory a `cd` earlier on the
/// line moved to (`None`: the project's, where the line started).
#[derive(Debug, Default, Clone, PartialEq)]
struct Simple {
    words: Vec<String>,
    outputs: Vec<String>,
    dir: Option<String>,
}

/// What the next word finishes.
#[derive(Clone, Copy, PartialEq)]
enum Next {
    Word,
    /// The target of an output redirection.
    Output,
    /// A word that is no operand (an input redirection's file, a here-string).
    Skip,
    /// A heredoc's delimiter (`true`: `<<-`, leading tabs stripped from the body's lines).
    Heredoc(bool),
}

/// Splits a command line into simple commands: words separated by blanks, `'…'` and `"…"`
/// quoting and `\` escapes as the shell reads them; `;`, `&`, `|`, `(`, `)`, `` ` ``, `$(` and
/// line ends separate commands (what a substitution runs is a command of its own); `#` at a
/// word's start comments out the rest of the line; `>`, `>>`, `>|`, `&>` and `N>` take the
/// next word as an output target (`>&N` duplicates a descriptor); `<`, `<<<` take it as no
/// operand; a heredoc's body (`<<WORD`, `<<-WORD`, `<<'WORD'`) is skipped up to its delimiter
/// line, and what follows it is read again. `cd DIR` (and `pushd`) moves the directory later
/// paths on the line are taken from. The `shlex` and `shell-words` crates split words only:
/// they know no operators, redirections or heredocs (`a;b` and `x>f` are one word to them), and
/// finding those needs the same quote tracking, so the splitter is this one.
fn simple_commands(command: &str) -> Vec<Simple> {
    let chars: Vec<char> = command.chars().collect();
    let mut out: Vec<Simple> = Vec::new();
    let mut current = Simple::default();
    let mut word: Option<String> = None;
    let mut next = Next::Word;
    let mut heredocs: Vec<(String, bool)> = Vec::new();
    let mut dir: Option<String> = None;
    let mut i = 0;

    // Finishes the word in hand into the slot `next` names.
    fn finish(word: &mut Option<String>, next: &mut Next, current: &mut Simple, heredocs: &mut Vec<(String, bool)>) {
        let Some(w) = word.take() else { return };
        match *next {
            Next::Word => current.words.push(w),
            Next::Output => current.outputs.push(w),
            Next::Skip => {}
            Next::Heredoc(strip) => heredocs.push((w, strip)),
        }
        *next = Next::Word;
    }
    // Ends the simple command in hand; a `cd` in it moves the directory of the ones after.
    let end = |current: &mut Simple, out: &mut Vec<Simple>, dir: &mut Option<String>| {
        let simple = std::mem::take(current);
        if matches!(simple.words.first().map(String::as_str), Some("cd" | "pushd")) {
            let target = simple.words.iter().skip(1).find(|w| !w.starts_with('-'));
            *dir = match target {
                Some(t) => Some(resolve(t, dir.as_deref())),
                None => Some("~".to_owned()),
            };
        }
        if !simple.words.is_empty() || !simple.outputs.is_empty() {
            out.push(simple);
        }
        current.dir = dir.clone();
    };

    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' | '\r' => {
                finish(&mut word, &mut next, &mut current, &mut heredocs);
                i += 1;
            }
            '\n' => {
                finish(&mut word, &mut next, &mut current, &mut heredocs);
                end(&mut current, &mut out, &mut dir);
                i += 1;
                // The bodies of the heredocs opened on this line, up to each delimiter line.
                for (delimiter, strip) in std::mem::take(&mut heredocs) {
                    while i < chars.len() {
                        let line_end = chars[i..].iter().position(|&c| c == '\n').map_or(chars.len(), |k| i + k);
                        let line: String = chars[i..line_end].iter().collect();
                        i = (line_end + 1).min(chars.len());
                        let line = if strip { line.trim_start_matches('\t') } else { line.as_str() };
                        if line.trim_end() == delimiter {
                            break;
                        }
                    }
                }
            }
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                i += 1;
                while i < chars.len() && chars[i] != '\'' {
                    w.push(chars[i]);
                    i += 1;
                }
                i += 1;
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' && i + 1 < chars.len() && matches!(chars[i + 1], '"' | '\\' | '$' | '`') {
                        i += 1;
                    }
                    w.push(chars[i]);
                    i += 1;
                }
                i += 1;
            }
            '\\' => {
                match chars.get(i + 1) {
                    Some('\n') => {}
                    Some(&escaped) => word.get_or_insert_with(String::new).push(escaped),
                    None => {}
                }
                i += 2;
            }
            '#' if word.is_none() => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '>' => {
                // `N>`: the word in hand is the descriptor.
                if word.as_deref().is_some_and(|w| !w.is_empty() && w.chars().all(|d| d.is_ascii_digit())) {
                    word = None;
                }
                finish(&mut word, &mut next, &mut current, &mut heredocs);
                i += 1;
                if matches!(chars.get(i), Some('>' | '|')) {
                    i += 1;
                }
                if chars.get(i) == Some(&'&') {
                    // `>&2`, `>&-`: a descriptor; `>& file` writes the file.
                    let mut j = i + 1;
                    while chars.get(j).is_some_and(|d| d.is_ascii_digit() || *d == '-') {
                        j += 1;
                    }
                    if j > i + 1 {
                        i = j;
                        continue;
                    }
                    i += 1;
                }
                next = Next::Output;
            }
            '<' => {
                finish(&mut word, &mut next, &mut current, &mut heredocs);
                if chars.get(i + 1) == Some(&'<') && chars.get(i + 2) == Some(&'<') {
                    i += 3;
                    next = Next::Skip;
                } else if chars.get(i + 1) == Some(&'<') {
                    i += 2;
                    let strip = chars.get(i) == Some(&'-');
                    if strip {
                        i += 1;
                    }
                    next = Next::Heredoc(strip);
                } else {
                    i += 1;
                    // `<(…)`: a process substitution, whose command is one of its own.
                    next = if chars.get(i) == Some(&'(') { Next::Word } else { Next::Skip };
                }
            }
            '&' if chars.get(i + 1) == Some(&'>') => {
                finish(&mut word, &mut next, &mut current, &mut heredocs);
                i += 2;
                if chars.get(i) == Some(&'>') {
                    i += 1;
                }
                next = Next::Output;
            }
            '$' if chars.get(i + 1) == Some(&'(') => {
                finish(&mut word, &mut next, &mut current, &mut heredocs);
                end(&mut current, &mut out, &mut dir);
                i += 2;
            }
            ';' | '&' | '|' | '(' | ')' | '`' => {
                finish(&mut word, &mut next, &mut current, &mut heredocs);
                end(&mut current, &mut out, &mut dir);
                i += 1;
            }
            _ => {
                word.get_or_insert_with(String::new).push(c);
                i += 1;
            }
        }
    }
    finish(&mut word, &mut next, &mut current, &mut heredocs);
    end(&mut current, &mut out, &mut dir);
    out
}

/// `path` taken from `dir` (a `cd` earlier on the line; `None`: the project's directory, where
/// a relative path stays relative).
fn resolve(path: &str, dir: Option<&str>) -> String {
    let absolute = path.starts_with('/') || path.starts_with('~') || path.starts_with('$') || path.get(1..2) == Some(":");
    match dir {
        Some(dir) if !absolute => format!("{}/{path}", dir.trim_end_matches('/')),
        _ => path.to_owned(),
    }
}

/// Commands that run the command after them (their own options and, for `env`, assignments
/// skipped).
const WRAPPERS: [&str; 8] = ["sudo", "env", "command", "exec", "time", "nohup", "nice", "xargs"];
/// Formatters whose `-w` rewrites the files they are given.
const FORMATTERS_W: [&str; 4] = ["gofmt", "goimports", "gofumpt", "shfmt"];
/// `git` subcommands that change the status or the recent commits.
const GIT_WRITES: [&str; 15] =
    ["add", "commit", "reset", "checkout", "switch", "restore", "apply", "stash", "rm", "mv", "merge", "rebase", "cherry-pick", "pull", "revert"];
/// `git` options before the subcommand that take the next word as their value.
const GIT_VALUED: [&str; 7] = ["-C", "-c", "--git-dir", "--work-tree", "--namespace", "--config-env", "--super-prefix"];

/// A Bash command writes files of the project (see the module doc).
pub fn bash_writes(command: &str, project: Option<&str>) -> bool {
    simple_commands(command).iter().any(|simple| simple_writes(simple, project))
}

/// The words that name files or directories a command is given: its words after the first that
/// are no option and no option's value (`valued`: the options taking the next word; `--x=v`
/// and a value glued to a short option are one word).
fn operands<'a>(words: &'a [String], valued: &[&str]) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut options_done = false;
    let mut skip = false;
    for w in words.iter().skip(1) {
        if skip {
            skip = false;
            continue;
        }
        if !options_done && w == "--" {
            options_done = true;
            continue;
        }
        if !options_done && w.starts_with('-') && w.len() > 1 {
            skip = valued.contains(&w.as_str());
            continue;
        }
        out.push(w.as_str());
    }
    out
}

/// A short-option cluster (`-pi`, `-i.bak`, `-Ei`) holds `-i` before any letter whose value
/// follows it (`valued`), or the word is `--in-place[=…]`.
fn in_place(word: &str, valued: &[char]) -> bool {
    if word == "--in-place" || word.starts_with("--in-place=") {
        return true;
    }
    let Some(cluster) = word.strip_prefix('-').filter(|c| !c.starts_with('-')) else { return false };
    for letter in cluster.chars() {
        if letter == 'i' {
            return true;
        }
        if valued.contains(&letter) || !letter.is_ascii_alphabetic() {
            return false;
        }
    }
    false
}

/// One simple command writes files of the project.
fn simple_writes(simple: &Simple, project: Option<&str>) -> bool {
    let dir = simple.dir.as_deref();
    let writes_to = |path: &str| {
        let path = resolve(path, dir);
        !path.is_empty() && path != "/dev/null" && !path.eq_ignore_ascii_case("nul") && inside(&path, project)
    };
    if simple.outputs.iter().any(|t| writes_to(t)) {
        return true;
    }
    // The command proper: past assignments (`A=b cmd`) and wrappers (`sudo`, `env`, `xargs`).
    let mut words: &[String] = &simple.words;
    // Behind `xargs` the files come from its input: a command naming none may write any.
    let mut via_xargs = false;
    loop {
        let Some(first) = words.first() else { return false };
        let name = first.rsplit('/').next().unwrap_or(first);
        let assignment = first.split_once('=').is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        if assignment {
            words = &words[1..];
        } else if WRAPPERS.contains(&name) {
            via_xargs |= name == "xargs";
            let valued: &[&str] = if name == "xargs" { &["-I", "-n", "-P", "-L", "-s", "-d", "-E", "-a"] } else { &["-u", "-g", "-n", "-C"] };
            let mut k = 1;
            while k < words.len() && words[k].starts_with('-') {
                k += if valued.contains(&words[k].as_str()) { 2 } else { 1 };
            }
            words = &words[k.min(words.len())..];
        } else {
            break;
        }
    }
    let name = words[0].rsplit('/').next().unwrap_or(&words[0]);
    let has = |flag: &str| words.iter().skip(1).any(|w| w == flag);
    // Files named: any inside the project (none named: only behind `xargs`, which supplies them).
    let any_inside = |files: &[&str]| if files.is_empty() { via_xargs } else { files.iter().any(|f| writes_to(f)) };
    match name {
        "sed" => {
            if !words.iter().skip(1).any(|w| in_place(w, &['e', 'f', 'l'])) {
                return false;
            }
            let mut files = operands(words, &["-e", "-f", "-l", "--expression", "--file"]);
            let scripted = words.iter().any(|w| w == "-e" || w == "-f" || w.starts_with("--expression") || w.starts_with("--file"));
            if !scripted && !files.is_empty() {
                files.remove(0);
            }
            any_inside(&files)
        }
        "perl" => {
            if !words.iter().skip(1).any(|w| in_place(w, &['e', 'E', 'I', 'M', 'm', 'x', 'C', 'd', 'D', 'l', '0'])) {
                return false;
            }
            let mut files = operands(words, &["-e", "-E", "-I", "-M", "-m"]);
            if !words.iter().any(|w| w == "-e" || w == "-E" || (w.starts_with('-') && !w.starts_with("--") && w.ends_with('e'))) && !files.is_empty() {
                files.remove(0);
            }
            any_inside(&files)
        }
        "git" => {
            // Global options first: `-C dir` moves where git runs (from where a `cd` left it).
            let mut repo: Option<String> = dir.map(str::to_owned);
            let mut k = 1;
            while k < words.len() && words[k].starts_with('-') {
                let option = words[k].as_str();
                if GIT_VALUED.contains(&option) {
                    if option == "-C" && let Some(value) = words.get(k + 1) {
                        repo = Some(resolve(value, repo.as_deref()));
                    }
                    if option == "--work-tree" && let Some(value) = words.get(k + 1) {
                        repo = Some(resolve(value, dir));
                    }
                    k += 2;
                } else {
                    if let Some(value) = option.strip_prefix("--work-tree=") {
                        repo = Some(resolve(value, dir));
                    }
                    k += 1;
                }
            }
            let writes = words.get(k).is_some_and(|sub| GIT_WRITES.contains(&sub.as_str()));
            writes && repo.is_none_or(|r| inside(&r, project))
        }
        "tee" => any_inside(&operands(words, &[])),
        "mkdir" => any_inside(&operands(words, &["-m", "--mode"])),
        "touch" => any_inside(&operands(words, &["-d", "-r", "-t", "--date", "--reference"])),
        "cp" | "mv" => {
            let valued = ["-t", "-S", "--target-directory", "--suffix"];
            let files = operands(words, &valued);
            let target = words
                .iter()
                .position(|w| w == "-t" || w == "--target-directory")
                .and_then(|k| words.get(k + 1).map(String::as_str))
                .or_else(|| words.iter().find_map(|w| w.strip_prefix("--target-directory=")))
                .or_else(|| files.last().copied().filter(|_| files.len() >= 2));
            // `mv` also takes its sources out of where they were.
            target.is_some_and(writes_to) || (name == "mv" && files.iter().any(|f| writes_to(f)))
        }
        // A formatter or fixer given no path works on the directory it runs in.
        c if FORMATTERS_W.contains(&c) => has("-w") && { let files = operands(words, &[]); files.is_empty() || any_inside(&files) },
        _ => (has("--write") || has("--fix")) && { let files = operands(words, &[]); files.is_empty() || any_inside(&files) },
    }
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

    #[test]
    fn git_with_a_directory_option_counts_where_it_runs() {
        let writes = |c: &str| bash_writes(c, PROJECT);
        assert!(writes("git -C /d/oh-my-posh commit -m 'x'"));
        assert!(writes("git -C src add -A"));
        assert!(writes("git -c user.name=bot --no-pager commit --amend --no-edit"));
        assert!(!writes("git -C /c/Users/j/dotfiles commit -am 'x'"));
        assert!(!writes("git --work-tree=/tmp/w checkout main -- ."));
        assert!(!writes("git -C /d/oh-my-posh log --oneline -3"));
        assert!(!writes("cd /c/Users/j/dotfiles && git commit -am wip"));
        // Relative paths that climb out of the project are outside it.
        assert!(!writes("git -C ../dotfiles commit -am wip"));
        assert!(!writes("cp README.md ../backup/"));
        assert!(!writes("cd .. && git commit -am wip"));
    }

    #[test]
    fn in_place_edits_in_any_option_cluster() {
        let writes = |c: &str| bash_writes(c, PROJECT);
        assert!(writes("perl -pi -e 's/old/new/g' src/a.go"));
        assert!(writes("perl -i.bak -pe 's/a/b/' src/a.go"));
        assert!(writes("sed -Ei 's/a/b/' src/a.go"));
        assert!(writes("sed --in-place -e 's/a/b/' src/a.go"));
        assert!(writes("find . -name '*.go' | xargs sed -i 's/a/b/'"));
        assert!(!writes("perl -ne 'print if /x/' src/a.go"));
        assert!(!writes("sed -n '1,5p' src/a.go"));
        assert!(!writes("sed -i 's/a/b/' /c/Users/j/.bashrc"));
        assert!(!writes("perl -pi -e 's/a/b/' /tmp/x.txt"));
    }

    #[test]
    fn commands_after_a_heredoc_are_read() {
        let writes = |c: &str| bash_writes(c, PROJECT);
        assert!(writes("cat <<'EOF' > /tmp/msg.txt\nnotes > here\nEOF\ngit commit -F /tmp/msg.txt"));
        assert!(writes("python3 - <<EOF\nprint(1)\nEOF\ntouch src/done.flag"));
        assert!(writes("cat <<-END\n\tbody\n\tEND\nmkdir -p build/out"));
        assert!(!writes("cat <<'EOF' > /tmp/msg.txt\nmkdir src/x; git commit\nEOF\ngo test ./..."));
        // A here-string and an input redirection name no target.
        assert!(!writes("grep x <<< 'a > b'; wc -l < src/a.go"));
    }

    #[test]
    fn file_commands_count_only_for_targets_inside_the_project() {
        let writes = |c: &str| bash_writes(c, PROJECT);
        assert!(writes("mkdir -p src/new"));
        assert!(writes("echo x | tee -a notes.md"));
        assert!(writes("cp /tmp/x.go src/x.go"));
        assert!(writes("cp -t /d/oh-my-posh/src /tmp/a.go"));
        assert!(writes("mv build/x.go /tmp/"));
        assert!(writes("touch /d/oh-my-posh/src/a.go"));
        assert!(!writes("mkdir -p /tmp/scratch && cd /tmp/scratch"));
        assert!(!writes("echo x | tee /tmp/log.txt >/dev/null"));
        assert!(!writes("cp src/a.go /tmp/a.go"));
        assert!(!writes("mv /tmp/a /tmp/b"));
        assert!(!writes("touch -d yesterday /tmp/stamp"));
        assert!(!writes("mkdir -m 700 ~/.cache/x"));
        // A `cd` out of the project moves the relative paths after it.
        assert!(!writes("cd /tmp && mkdir out && echo x > out/a.txt"));
        assert!(writes("cd /tmp && cd /d/oh-my-posh/src && touch a.go"));
    }

    #[test]
    fn the_splitter_reads_quotes_escapes_and_substitutions() {
        let words = |c: &str| simple_commands(c).into_iter().map(|s| s.words.join(" ")).collect::<Vec<_>>();
        assert_eq!(words("echo 'a; b' \"c | d\" e\\ f; ls"), ["echo a; b c | d e f", "ls"]);
        assert_eq!(words("x=$(git rev-parse HEAD) # comment > f"), ["x=", "git rev-parse HEAD"]);
        assert_eq!(simple_commands("cmd 2>&1 >out.txt 2>/dev/null")[0].outputs, ["out.txt", "/dev/null"]);
    }

    proptest::proptest! {
        /// The classifier reads any text without panicking (multi-byte characters, unclosed
        /// quotes and heredocs, stray operators), with or without a project.
        #[test]
        fn the_classifier_never_panics(command in ".*", shell in r#"[a-z <>|&;'"\\$()`#\n\t=-]{0,64}"#, project in proptest::option::of("[/a-zA-Z:._-]{0,12}")) {
            let project = project_dir(project.as_deref());
            let _ = bash_writes(&command, project.as_deref());
            let _ = bash_writes(&shell, project.as_deref());
            let _ = tool_use_changes_tree("Bash", &json!({"command": shell}), project.as_deref());
        }
    }
}
