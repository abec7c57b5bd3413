//! The system context's git snapshot: from the scenario's repository state, truncated,
//! memoized, switched off where the reference switches it off, and in subagent prompts.

use ctxsim::api::Request;
use ctxsim::runner::{RunOutput, run_scenario};
use ctxsim::scenario::{load_scenario, parse_scenario};
use ctxsim::strategy::Strategy;

use crate::support::measurer;

fn check_run(yaml: &str) -> RunOutput {
    crate::support::run_yaml(yaml)
}

/// The `gitStatus: …` element of a request's last system block, if any.
fn check_git_status(request: &Request) -> Option<String> {
    let blocks = request.system_blocks();
    let last = &blocks.last()?.text;
    last.find("gitStatus: ").map(|at| last[at..].to_owned())
}

fn check_error(yaml: &str) -> String {
    match parse_scenario(yaml, "scenarios/bad.yaml") {
        Ok(_) => panic!("scenario loaded but should fail:\n{yaml}"),
        Err(e) => e.to_string(),
    }
}

/// One turn in a world with `world_extra` (indented under `world:`).
fn one_turn(world_extra: &str) -> String {
    format!("name: t\nworld:\n  model: claude-sonnet-4-5\n{world_extra}script:\n  - user: hi\n  - assistant:\n      - text: hello\n")
}

const REPO: &str = "  git:\n    branch: topic\n    status: [\" M a.rs\"]\n    recent_commits: [\"abc1234 Start\"]\n";

#[test]
fn git_status_scenario_is_the_last_system_element_and_stays_memoized() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/git-status.yaml");
    let output = run_scenario(&load_scenario(&path).unwrap(), &mut measurer(), &Strategy::default()).unwrap();
    let first = check_git_status(&output.requests[0]).expect("gitStatus in the dynamic block");
    // The dynamic block (no marker) ends with it; its paragraphs in the reference's order.
    assert_eq!(output.requests[0].system_blocks().len(), 4);
    assert!(output.requests[0].system_blocks()[3].cache_control.is_none());
    let paragraphs: Vec<&str> = first.split("\n\n").collect();
    assert!(paragraphs[0].starts_with("gitStatus: This is the git status at the start of the conversation."));
    assert_eq!(&paragraphs[1..4], ["Current branch: feature/cache-keys", "Main branch (you will usually use this for PRs): main", "Git user: Ada Lovelace"]);
    assert_eq!(paragraphs[4], "Status:\n M src/cache.rs\n M src/key.rs\n?? notes/cache-design.md");
    // `git log -n 5`: the sixth commit is not there.
    assert!(paragraphs[5].starts_with("Recent commits:\n9f1c2ab ") && paragraphs[5].ends_with("5e6f7a8 First cache simulator"));
    assert!(!first.contains("Initial commit"));
    // The commit between turns does not reach the prompt: memoized for the session.
    assert_eq!(check_git_status(&output.requests[1]), Some(first.clone()));
    assert_eq!(output.requests[0].system, output.requests[4].system);
    assert_eq!(output.summary.cache_breaks, 0);
    // The general-purpose subagent ends its single content block with the same snapshot.
    assert_eq!(output.rows[2].lane, "subagent:general-purpose");
    assert_eq!(check_git_status(&output.requests[2]), Some(first));
}

#[test]
fn git_status_is_cut_at_2000_characters_with_a_note() {
    let lines: Vec<String> = (0..120).map(|i| format!("\"?? generated/output-file-{i:03}.txt\"")).collect();
    let yaml = one_turn(&format!("  git:\n    branch: topic\n    status: [{}]\n", lines.join(", ")));
    let status = check_git_status(&check_run(&yaml).requests[0]).unwrap();
    let body = status.split("Status:\n").nth(1).unwrap().split("\n\nRecent commits:").next().unwrap();
    let (kept, note) = body.rsplit_once('\n').unwrap();
    assert_eq!(kept.chars().count(), 2000, "{kept}");
    assert!(kept.starts_with("?? generated/output-file-000.txt\n?? generated/output-file-001.txt"));
    assert!(note.starts_with("... (output cut at 2000 characters"), "{note}");
    assert!(!body.contains("output-file-119"));
}

#[test]
fn git_status_is_absent_outside_a_repo_when_turned_off_and_for_explore() {
    // No repository: no gitStatus, and the env line says so.
    let plain = check_run(&one_turn(""));
    assert_eq!(check_git_status(&plain.requests[0]), None);
    assert!(plain.requests[0].system_blocks()[3].text.contains("Is a git repository: false"));
    // A scripted repository without a .git directory is a repository.
    let repo = check_run(&one_turn(REPO));
    assert!(check_git_status(&repo.requests[0]).unwrap().contains("Status:\n M a.rs"));
    assert!(repo.requests[0].system_blocks()[3].text.contains("Is a git repository: true"));
    // CLAUDE_CODE_REMOTE, CLAUDE_CODE_DISABLE_GIT_INSTRUCTIONS and includeGitInstructions: false.
    for extra in ["  env: {CLAUDE_CODE_REMOTE: 1}\n", "  env: {CLAUDE_CODE_DISABLE_GIT_INSTRUCTIONS: true}\n", "  settings: {includeGitInstructions: false}\n"] {
        let output = check_run(&one_turn(&format!("{REPO}{extra}")));
        assert_eq!(check_git_status(&output.requests[0]), None, "{extra}");
    }
    // Explore leaves it out; a clean tree reads `(clean)`.
    let yaml = "name: t\nworld:\n  model: claude-sonnet-4-5\n  git: {branch: topic}\nscript:\n  - user: look\n  - assistant:\n      - tool_use: {name: Agent, input: {description: d, prompt: \"Look around.\", subagent_type: Explore}}\n  - assistant:\n      - text: nothing\n    lane: subagent:Explore\n  - assistant:\n      - text: done\n".to_string();
    let output = check_run(&yaml);
    assert!(check_git_status(&output.requests[0]).unwrap().contains("Status:\n(clean)"));
    assert_eq!(check_git_status(&output.requests[1]), None);
    assert!(output.requests[1].system_blocks()[2].text.contains("Is directory a git repo: Yes"));
}

#[test]
fn git_state_errors_name_line_and_field() {
    let err = check_error("name: t\nworld:\n  model: m\n  git:\n    branch: \"my branch\"\n");
    assert_eq!(err, "scenarios/bad.yaml:5:13: world.git.branch: must be a branch name without spaces, found `my branch`");
    let err = check_error("name: t\nworld:\n  model: m\nscript:\n  - git:\n      branch: main\n      status: [\" M a\", \"\"]\n");
    assert_eq!(err, "scenarios/bad.yaml:7:24: script[0].git.status[1]: must be one non-empty line");
    let err = check_error("name: t\nworld:\n  model: m\n  git: {branch: main, sha: abc}\n");
    assert!(err.starts_with("scenarios/bad.yaml:4:") && err.contains("world.git") && err.contains("unknown field `sha`"), "{err}");
}
