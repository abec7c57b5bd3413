//! Relevant memories: the prefetch's selection request, the attachments after the first tool
//! round, their budgets and headers.

use ctxsim::agent::memories::{self, MemoryCandidate, MemoryState, SurfacedMemory};
use ctxsim::runner::{RunOutput, run_scenario};
use ctxsim::scenario::load_scenario;
use ctxsim::strategy::Strategy;

use crate::support::measurer;

fn check_run(yaml: &str) -> RunOutput {
    crate::support::run_yaml(yaml)
}

fn check_lanes(output: &RunOutput, expected: &[&str]) {
    assert_eq!(crate::support::lanes(output), expected);
}

fn messages(output: &RunOutput, request: usize) -> String {
    serde_json::to_string(&output.requests[request].messages).unwrap()
}

const MEMORY_DIR: &str = "/home/user/.claude/projects/-repo/memory";

/// A session with two memory files and the gate as given.
fn world(gate: bool) -> String {
    let env = if gate { "\n  env: {CTXSIM_RELEVANT_MEMORIES: 1}" } else { "" };
    format!(
        r#"name: t
world:
  model: claude-sonnet-4-5{env}
  files:
    /repo/notes.txt: "n\n"
    {MEMORY_DIR}/MEMORY.md: "- [Deploy](deploy.md): deploy steps\n"
    {MEMORY_DIR}/deploy.md: "---\ndescription: How the service is deployed to staging\n---\nDeploy with make stage.\n"
    {MEMORY_DIR}/naming.md: "---\ndescription: Naming rules for database tables\n---\nTables are singular.\n"
"#
    )
}

#[test]
fn relevant_memories_scenario_surfaces_dedups_and_marks_stale_ones() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/relevant-memories.yaml");
    let output = run_scenario(&load_scenario(&path).unwrap(), &mut measurer(), &Strategy::default()).unwrap();
    check_lanes(&output, &["side", "main", "main", "side", "main", "main", "main"]);
    // MEMORY.md is left out of claudeMd.
    assert!(!messages(&output, 1).contains("[Build notes](build-notes.md)"));
    // The selection request lists the files (not the index) with their descriptions.
    let query = messages(&output, 0);
    assert!(query.contains("- build-notes.md: The simd feature builds only on the nightly toolchain\\n- release.md: Steps to cut a release of fastsum"), "{query}");
    assert!(!query.contains("MEMORY.md"));
    // Turn 1: not before the first tool round, then folded into its tool_result.
    assert!(!messages(&output, 1).contains("Memory (saved"));
    assert!(messages(&output, 2).contains("<system-reminder>\\nMemory (saved today): /home/user/.claude/projects/-repo/memory/build-notes.md:\\n\\n---\\nname: build-notes"));
    // Turn 2: build-notes.md is skipped (already surfaced); release.md is two days old.
    let second = serde_json::to_string(output.requests[5].messages.last().unwrap()).unwrap();
    assert!(second.contains("This memory was saved 2 days ago.") && second.contains("Memory: /home/user/.claude/projects/-repo/memory/release.md:"), "{second}");
    assert!(!second.contains("build-notes.md"));
    // The selection runs alongside: the main request goes out at the same virtual time.
    assert_eq!(output.rows[3].time_ms, output.rows[4].time_ms);
    assert_eq!(output.summary.lanes["side"].requests, 2);
}

#[test]
fn unscripted_selection_picks_by_shared_words_and_skips_files_read_in_the_round() {
    let yaml = world(true)
        + r#"    /home/user/.claude/projects/-repo/memory/release.md: "---\ndescription: Release checklist\n---\nTag, then publish.\n"
script:
  - user: "Deploy the service to staging please"
  - assistant:
      - tool_use: {name: Read, input: {file_path: /repo/notes.txt}}
  - assistant:
      - text: "Deploying."
  - user: "What are the naming rules for tables?"
  - assistant:
      - tool_use: {name: Read, input: {file_path: /home/user/.claude/projects/-repo/memory/naming.md}}
  - assistant:
      - text: "Tables are singular."
  - user: "Cut the release now"
  - assistant:
      - text: "No tool round, so nothing is attached."
  - user: "ok then"
  - assistant:
      - tool_use: {name: Read, input: {file_path: /repo/notes.txt}}
  - assistant:
      - text: "done"
"#;
    let output = check_run(&yaml);
    check_lanes(&output, &["side", "main", "main", "side", "main", "main", "side", "main", "side", "main", "main"]);
    // Shared words (deploy, service, staging) choose deploy.md, not naming.md.
    let first = messages(&output, 2);
    assert!(first.contains("Memory (saved today): /home/user/.claude/projects/-repo/memory/deploy.md:"), "{first}");
    assert_eq!(first.matches("Memory (saved").count(), 1);
    // Turn 2 chooses naming.md, which the agent read in that very round: skipped.
    assert!(messages(&output, 3).contains("Query: What are the naming rules for tables?"));
    assert_eq!(messages(&output, 5).matches("Memory (saved").count(), 1);
    // Turn 3 chooses release.md but ends without a tool round: nothing is attached, and the
    // prefetch does not carry over to turn 4 (whose words choose nothing).
    let last = messages(&output, 10);
    assert!(!last.contains("release.md:"), "{last}");
    assert_eq!(last.matches("Memory (saved").count(), 1);
}

#[test]
fn without_the_gate_memory_md_stays_and_no_selection_is_sent() {
    let yaml = world(false)
        + r#"script:
  - user: "Deploy the service to staging please"
  - assistant:
      - tool_use: {name: Read, input: {file_path: /repo/notes.txt}}
  - assistant:
      - text: "Deploying."
"#;
    let output = check_run(&yaml);
    check_lanes(&output, &["main", "main"]);
    assert!(messages(&output, 0).contains("- [Deploy](deploy.md): deploy steps"));
    assert!(!messages(&output, 1).contains("Memory (saved"));
}

fn candidate(name: &str, description: &str, mtime_ms: i64) -> MemoryCandidate {
    MemoryCandidate { name: name.into(), path: format!("{MEMORY_DIR}/{name}"), description: description.into(), mtime_ms }
}

#[test]
fn memory_budgets_headers_and_selection_parsing() {
    let day = 86_400_000;
    assert_eq!(memories::header("/m/a.md", 5 * day, 5 * day + 10), "Memory (saved today): /m/a.md:");
    assert_eq!(memories::header("/m/a.md", 0, day + 1), "Memory (saved yesterday): /m/a.md:");
    assert!(memories::header("/m/a.md", 0, 9 * day).starts_with("This memory was saved 9 days ago."));
    assert!(memories::header("/m/a.md", 0, 9 * day).ends_with("\n\nMemory: /m/a.md:"));

    let long: String = (0..300).map(|i| format!("line {i}\n")).collect();
    let clipped = memories::clip(&long);
    assert_eq!(clipped.lines().filter(|l| l.starts_with("line ")).count(), 200);
    assert!(clipped.ends_with("read the file for the rest."));
    let wide = "x".repeat(100) + "\n";
    let clipped = memories::clip(&wide.repeat(60));
    assert!(clipped.len() <= memories::BYTES_MAX + 80 && clipped.contains("cut to its size limit"));
    assert_eq!(memories::clip("short\n"), "short");

    let candidates: Vec<MemoryCandidate> = (0..8).map(|i| candidate(&format!("m{i}.md"), "d", 0)).collect();
    let many = r#"{"selected_memories": ["m1.md", "nope.md", "m1.md", "m2.md", "m3.md", "m4.md", "m5.md", "m6.md"]}"#;
    assert_eq!(memories::parse_selection(many, &candidates), ["m1.md", "m2.md", "m3.md", "m4.md", "m5.md"]);
    assert_eq!(memories::parse_selection("- m7.md\nm0.md\n", &candidates), ["m7.md", "m0.md"]);
    assert!(memories::prompt_qualifies("two words") && !memories::prompt_qualifies("  one  "));

    // Newest first among equal scores.
    let picks = memories::select_by_words("deploy staging", &[candidate("old.md", "deploy notes", 0), candidate("new.md", "deploy notes", 5)]);
    assert_eq!(picks, ["new.md", "old.md"]);

    // The session budget: once 60 KB were surfaced, nothing more is.
    let mut state = MemoryState::default();
    let big = |i: usize| SurfacedMemory { path: format!("/m/{i}.md"), header: "h".into(), content: "c".repeat(4000) };
    let admitted = state.admit((0..20).map(big).collect(), &|_| false);
    assert_eq!(admitted.len(), 16, "16 × 4001 bytes pass 60 KB at the 16th");
    assert!(state.admit(vec![big(99)], &|_| false).is_empty());
    state.reset();
    assert_eq!(state.admit(vec![big(99)], &|p| p == "/m/99.md").len(), 0, "a file the agent read is skipped");
}
