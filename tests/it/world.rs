//! The World's pieces: clock, virtual fs, rng, scripted model.

use ctxsim::api::{ContentBlock, StopReason};
use ctxsim::world::{Clock, DirAnswer, Fallback, Reply, Rng, ScriptedModel, Synthesis, VirtualFs};
use proptest::prelude::*;

// ---- helpers ---------------------------------------------------------------------------------

/// A fs holding `files` (path -> contents), written at virtual time 0.
fn fs_with(files: &[&str]) -> (VirtualFs, Clock) {
    let clock = Clock::new(0);
    let mut fs = VirtualFs::new();
    for path in files {
        fs.write(path, format!("contents of {path}"), &clock).unwrap();
    }
    (fs, clock)
}

/// `list_dir` rendered one entry per line, directories with a trailing `/`.
fn check_list(files: &[&str], dir: &str, expect: &str) {
    let (fs, _) = fs_with(files);
    let listing: Vec<String> =
        fs.list_dir(dir).unwrap().into_iter().map(|e| if e.is_dir { format!("{}/", e.name) } else { e.name }).collect();
    assert_eq!(listing.join("\n"), expect.trim());
}

fn check_walk(files: &[&str], dir: &str, expect: &str) {
    let (fs, _) = fs_with(files);
    let walked: Vec<String> = fs.walk(dir).unwrap().into_iter().map(|e| e.path).collect();
    assert_eq!(walked.join("\n"), expect.trim());
}

fn check_glob(files: &[&str], pattern: &str, base: &str, expect: &str) {
    let (fs, _) = fs_with(files);
    assert_eq!(fs.glob(pattern, base).unwrap().join("\n"), expect.trim());
}

const TREE: &[&str] = &["/repo/src/main.rs", "/repo/src/lib.rs", "/repo/src/a/b.rs", "/repo/README.md", "/repo/src.txt", "/etc/hosts"];

// ---- clock -----------------------------------------------------------------------------------

#[test]
fn clock_dates_follow_the_time_zone() {
    // 2026-03-01T23:30:00Z
    let clock = Clock::new(1_772_407_800_000);
    assert_eq!(clock.date_string(), "2026-03-01");
    assert_eq!(clock.rfc3339(), "2026-03-01T23:30:00.000Z");
    let paris = clock.clone().with_time_zone("+01:00").unwrap();
    assert_eq!(paris.date_string(), "2026-03-02");
    let la = clock.with_time_zone("-08:00").unwrap();
    assert_eq!(la.date_string(), "2026-03-01");
}

#[test]
fn clock_detects_date_rollover() {
    let mut clock = Clock::new(1_772_407_800_000); // 23:30 UTC
    clock.advance(20 * 60_000);
    assert!(!clock.date_rolled_over_since(0));
    clock.set(31 * 60_000);
    assert_eq!(clock.now_ms(), 1_860_000);
    assert!(clock.date_rolled_over_since(0));
    assert_eq!(clock.date_string(), "2026-03-02");
}

#[test]
#[should_panic(expected = "virtual clock moved backwards: now_ms=5000 set=10")]
fn clock_never_goes_back() {
    let mut clock = Clock::new(0);
    clock.advance(5000);
    clock.set(10);
}

#[test]
fn clock_rejects_bad_time_zones() {
    assert!(Clock::new(0).with_time_zone("+5:3").is_err());
    assert!(Clock::new(0).with_time_zone("+€1").is_err());
    assert!(Clock::new(0).with_time_zone("Not/AZone").is_err());
    assert!(Clock::new(0).with_time_zone("UTC").is_ok());
}

// ---- fs --------------------------------------------------------------------------------------

#[test]
fn list_dir_is_sorted_and_merges_implicit_dirs() {
    check_list(TREE, "/repo", "README.md\nsrc/\nsrc.txt");
    check_list(TREE, "/repo/src/", "a/\nlib.rs\nmain.rs");
    check_list(TREE, "/", "etc/\nrepo/");
}

#[test]
fn walk_is_depth_first_by_name() {
    check_walk(
        TREE,
        "/repo",
        "
/repo/README.md
/repo/src
/repo/src/a
/repo/src/a/b.rs
/repo/src/lib.rs
/repo/src/main.rs
/repo/src.txt",
    );
}

#[test]
fn glob_matches_relative_and_absolute_patterns() {
    check_glob(TREE, "**/*.rs", "/repo", "/repo/src/a/b.rs\n/repo/src/lib.rs\n/repo/src/main.rs");
    check_glob(TREE, "src/*.rs", "/repo", "/repo/src/lib.rs\n/repo/src/main.rs");
    check_glob(TREE, "/repo/*.md", "/", "/repo/README.md");
    check_glob(TREE, "*.rs", "/repo", "");
}

/// A copy of the fs keeps none of the changes made before it, yet its own marks read the
/// changes made on it since, as the original's read its own: a copy of a copy too; a mark of
/// one tree reads nothing of another.
#[test]
fn changes_since_a_mark_are_the_trees_own_across_copies() {
    let (mut fs, clock) = fs_with(&["/a.txt", "/b.txt"]);
    let before_copy = fs.change_mark();
    let mut copy = fs.clone();
    assert_eq!(copy.files_changed_since(before_copy), None, "a copy does not read the original's marks");
    let copied = copy.change_mark();
    assert_eq!(copy.files_changed_since(copied), Some(&[][..]));
    copy.write("/c.txt", "c", &clock).unwrap();
    copy.remove("/a.txt", &clock).unwrap();
    let middle = copy.change_mark();
    copy.write("/b.txt", "b again", &clock).unwrap();
    fn changed(paths: Option<&[String]>) -> Option<Vec<&str>> {
        paths.map(|paths| paths.iter().map(String::as_str).collect())
    }
    assert_eq!(changed(copy.files_changed_since(copied)), Some(vec!["/c.txt", "/a.txt", "/b.txt"]));
    assert_eq!(changed(copy.files_changed_since(middle)), Some(vec!["/b.txt"]));
    // The original goes on apart from its copy.
    fs.write("/d.txt", "d", &clock).unwrap();
    assert_eq!(changed(fs.files_changed_since(before_copy)), Some(vec!["/d.txt"]));
    assert_eq!(fs.files_changed_since(copied), None);
    // A copy of the copy, from a mark taken on it.
    let mut again = copy.clone();
    let start = again.change_mark();
    again.write("/e.txt", "e", &clock).unwrap();
    assert_eq!(changed(again.files_changed_since(start)), Some(vec!["/e.txt"]));
    assert_eq!(again.files_changed_since(middle), None);
    assert_eq!(changed(copy.files_changed_since(middle)), Some(vec!["/b.txt"]), "a copy's changes are not its copy's");
}

#[test]
fn a_kept_is_dir_answer_is_taken_again_only_where_no_change_reaches_it() {
    // Asked at every request (is the cwd a git repository?): the answer kept with the tree's
    // mark is read again while the tree changes elsewhere, asked again where a file under the
    // path or an explicit directory changed, and on a copy of the tree.
    let (mut fs, clock) = fs_with(&["/repo/src/main.rs"]);
    let mut kept = None;
    let made = std::cell::Cell::new(0);
    let ask = |fs: &VirtualFs, kept: &mut Option<DirAnswer>| {
        let answer = fs.is_dir_kept(kept, || {
            made.set(made.get() + 1);
            "/repo/./.git".to_owned()
        });
        assert_eq!(answer, fs.is_dir("/repo/.git"), "a kept answer differs from asking the tree");
        answer
    };
    assert!(!ask(&fs, &mut kept));
    fs.write("/repo/src/lib.rs", "lib", &clock).unwrap();
    assert!(!ask(&fs, &mut kept));
    assert_eq!(made.get(), 1, "a change elsewhere leaves the answer");
    fs.write("/repo/.git/HEAD", "ref: refs/heads/main", &clock).unwrap();
    assert!(ask(&fs, &mut kept));
    fs.write("/repo/README.md", "readme", &clock).unwrap();
    assert!(ask(&fs, &mut kept));
    assert_eq!(made.get(), 2);
    fs.remove("/repo/.git/HEAD", &clock).unwrap();
    assert!(!ask(&fs, &mut kept));
    fs.create_dir("/repo/.git").unwrap();
    assert!(ask(&fs, &mut kept));
    assert_eq!(made.get(), 4, "a file under the path and an explicit directory are asked again");
    let copy = fs.clone();
    assert!(ask(&copy, &mut kept));
    assert_eq!(made.get(), 5, "a copy of the tree is asked again");
}

#[test]
fn kept_nested_skill_dirs_are_looked_for_again_only_where_a_change_may_move_them() {
    // Asked at every touch of a file: the `.claude/skills` directories between the file and
    // the cwd, kept by the file's directory while the tree changes outside every such
    // directory; looked for again after a change under one, a made directory, on a copy of
    // the tree and under another cwd.
    use ctxsim::agent::skills::{nested_skill_dirs, nested_skill_dirs_kept, new_nested_skill_dirs_kept};
    let (mut fs, clock) = fs_with(&["/repo/pkg/src/a.rs"]);
    let mut kept = new_nested_skill_dirs_kept();
    let ask = |fs: &VirtualFs, kept: &mut _, file: &str, cwd: &str| {
        let dirs = nested_skill_dirs_kept(fs, file, cwd, kept);
        assert_eq!(dirs, nested_skill_dirs(fs, file, cwd), "kept directories above {file} differ from looking");
        dirs
    };
    let none: Vec<String> = Vec::new();
    assert_eq!(ask(&fs, &mut kept, "/repo/pkg/src/a.rs", "/repo"), none);
    fs.write("/repo/pkg/src/b.rs", "b", &clock).unwrap();
    assert_eq!(ask(&fs, &mut kept, "/repo/pkg/src/b.rs", "/repo"), none);
    fs.write("/repo/pkg/.claude/skills/x/SKILL.md", "---\nname: x\n---\n", &clock).unwrap();
    assert_eq!(ask(&fs, &mut kept, "/repo/pkg/src/a.rs", "/repo"), vec!["/repo/pkg/.claude/skills".to_owned()]);
    assert_eq!(ask(&fs, &mut kept, "/repo/pkg/src/a.rs", "/repo/pkg"), none, "the cwd's own directory is not nested");
    fs.create_dir("/repo/pkg/src/.claude/skills").unwrap();
    assert_eq!(ask(&fs, &mut kept, "/repo/pkg/src/a.rs", "/repo"), vec!["/repo/pkg/src/.claude/skills".to_owned(), "/repo/pkg/.claude/skills".to_owned()]);
    fs.remove("/repo/pkg/.claude/skills/x/SKILL.md", &clock).unwrap();
    assert_eq!(ask(&fs, &mut kept, "/repo/pkg/src/a.rs", "/repo"), vec!["/repo/pkg/src/.claude/skills".to_owned()]);
    let mut copy = fs.clone();
    copy.remove("/repo/pkg/src/.claude/skills", &clock).unwrap();
    assert_eq!(ask(&copy, &mut kept, "/repo/pkg/src/a.rs", "/repo"), none);
    // (A `.` component is one more level: the same directory under two names.)
    assert_eq!(ask(&fs, &mut kept, "/repo/pkg/src/./a.rs", "/repo"), vec!["/repo/pkg/src/./.claude/skills".to_owned(), "/repo/pkg/src/.claude/skills".to_owned()]);
}

#[test]
fn glob_reports_bad_patterns() {
    let (fs, _) = fs_with(TREE);
    let err = fs.glob("src/[", "/repo").unwrap_err();
    assert!(err.to_string().starts_with("failed to compile glob pattern `src/[`"), "{err}");
}

#[test]
fn paths_are_normalized_and_must_be_absolute() {
    let (fs, _) = fs_with(&["/repo/a.txt"]);
    assert_eq!(fs.read("/repo/./x/../a.txt").unwrap(), "contents of /repo/a.txt");
    assert_eq!(fs.read("//repo//a.txt").unwrap(), "contents of /repo/a.txt");
    assert_eq!(
        fs.read("repo/a.txt").unwrap_err().to_string(),
        "failed to resolve `repo/a.txt`: virtual paths must be absolute POSIX paths"
    );
    assert!(fs.is_dir("/repo") && fs.exists("/repo") && !fs.is_file("/repo"));
    assert_eq!(fs.read("/repo").unwrap_err().to_string(), "failed to access /repo: is a directory");
    assert_eq!(fs.read("/nope").unwrap_err().to_string(), "failed to read /nope: no such file or directory");
}

#[test]
fn files_cannot_nest_under_files() {
    let (mut fs, clock) = fs_with(&["/repo/a.txt"]);
    let err = fs.write("/repo/a.txt/b", "x", &clock).unwrap_err();
    assert_eq!(err.to_string(), "failed to access /repo/a.txt/b: a parent path is a file, not a directory");
    assert!(fs.write("/repo", "x", &clock).is_err());
}

#[test]
fn edit_replaces_exactly_once_unless_asked() {
    let clock = Clock::new(0);
    let mut fs = VirtualFs::new();
    fs.write("/f", "a b a", &clock).unwrap();
    assert_eq!(fs.edit("/f", "b", "c", false, &clock).unwrap(), 1);
    assert_eq!(fs.read("/f").unwrap(), "a c a");
    let err = fs.edit("/f", "a", "x", false, &clock).unwrap_err();
    assert_eq!(err.to_string(), "failed to edit /f: the text to replace occurs 2 times; give more context or replace all");
    assert_eq!(fs.edit("/f", "a", "x", true, &clock).unwrap(), 2);
    assert_eq!(fs.read("/f").unwrap(), "x c x");
    assert!(fs.edit("/f", "zzz", "y", false, &clock).is_err());
}

#[test]
fn journal_answers_what_changed_since() {
    let mut clock = Clock::new(0);
    let mut fs = VirtualFs::new();
    fs.seed("/repo/seeded.rs", "initial", &clock).unwrap();
    clock.advance(1000);
    fs.write("/repo/b.rs", "1", &clock).unwrap();
    clock.advance(1000);
    fs.write("/repo/a.rs", "2", &clock).unwrap();
    fs.edit("/repo/b.rs", "1", "3", false, &clock).unwrap();
    clock.advance(1000);
    fs.remove("/repo", &clock).unwrap();
    assert_eq!(fs.paths_changed_since(0), ["/repo/a.rs", "/repo/b.rs", "/repo/seeded.rs"]);
    assert_eq!(fs.paths_changed_since(1000), ["/repo/a.rs", "/repo/b.rs", "/repo/seeded.rs"]);
    let kinds: Vec<String> = fs.changes_since(1000).iter().map(|c| format!("{} {} {:?}", c.time_ms, c.path, c.kind)).collect();
    assert_eq!(
        kinds,
        [
            "2000 /repo/a.rs Write",
            "2000 /repo/b.rs Write",
            "3000 /repo/a.rs Remove",
            "3000 /repo/b.rs Remove",
            "3000 /repo/seeded.rs Remove"
        ]
    );
    assert!(!fs.exists("/repo"));
    assert_eq!(fs.entry("/repo/a.rs").map(|e| e.mtime_ms).ok(), None);
}

#[test]
fn mtimes_come_from_the_clock() {
    let mut clock = Clock::new(0);
    clock.advance(42);
    let mut fs = VirtualFs::new();
    fs.write("/x", "", &clock).unwrap();
    assert_eq!(fs.entry("/x").unwrap().mtime_ms, 42);
}

#[test]
fn explicit_empty_dirs_are_listed() {
    let (mut fs, _) = fs_with(&["/repo/a.txt"]);
    fs.create_dir("/repo/empty").unwrap();
    assert!(fs.is_dir("/repo/empty"));
    assert_eq!(fs.list_dir("/repo/empty").unwrap(), []);
    let names: Vec<_> = fs.list_dir("/repo").unwrap().into_iter().map(|e| (e.name, e.is_dir)).collect();
    assert_eq!(names, [("a.txt".to_owned(), false), ("empty".to_owned(), true)]);
}

#[test]
fn load_from_dir_reads_a_real_tree_sorted_skipping_git_and_binaries() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::create_dir_all(root.join(".git/objects")).unwrap();
    std::fs::write(root.join("src/main.rs"), "fn main() {}").unwrap();
    std::fs::write(root.join("README.md"), "# hi").unwrap();
    std::fs::write(root.join(".git/HEAD"), "ref: refs/heads/main").unwrap();
    std::fs::write(root.join("logo.bin"), [0xff, 0xfe, 0x00]).unwrap();
    let mut clock = Clock::new(0);
    clock.advance(7);
    let mut fs = VirtualFs::new();
    let report = fs.load_from_dir(root, "/repo", &clock).unwrap();
    assert_eq!(report.files_loaded, 2);
    assert_eq!(report.skipped_binary, ["/repo/logo.bin"]);
    let files: Vec<_> = fs.files().map(|(p, e)| format!("{p} {}", e.mtime_ms)).collect();
    assert_eq!(files, ["/repo/README.md 7", "/repo/src/main.rs 7"]);
    assert!(fs.journal().is_empty(), "initial state is not a change");
}

proptest! {
    #[test]
    fn fs_listings_are_sorted_and_independent_of_insertion_order(
        paths in prop::collection::btree_set("/[abc]{1,2}(/[abc.]{1,3}){0,3}", 1..20),
        seed in any::<u64>(),
    ) {
        let paths: Vec<String> = paths.into_iter().collect();
        let mut shuffled = paths.clone();
        Rng::new(seed).shuffle(&mut shuffled);
        let build = |order: &[String]| {
            let clock = Clock::new(0);
            let mut fs = VirtualFs::new();
            // Some paths conflict (a file where another needs a directory); both orders must
            // agree on the final listing only when every write succeeded, so skip conflicts.
            let mut ok = true;
            for p in order {
                ok &= fs.write(p, "x", &clock).is_ok();
            }
            (fs, ok)
        };
        let (a, ok_a) = build(&paths);
        let (b, ok_b) = build(&shuffled);
        prop_assume!(ok_a && ok_b);
        let walk_a = a.walk("/").unwrap();
        prop_assert_eq!(&walk_a, &b.walk("/").unwrap());
        prop_assert_eq!(a.glob("**", "/").unwrap(), b.glob("**", "/").unwrap());
        for entry in walk_a.iter().filter(|e| e.is_dir) {
            let listing = a.list_dir(&entry.path).unwrap();
            let mut sorted = listing.clone();
            sorted.sort_by(|x, y| x.name.cmp(&y.name));
            prop_assert_eq!(&listing, &sorted);
            prop_assert_eq!(listing, b.list_dir(&entry.path).unwrap());
        }
    }

    /// A value derived from the tree (`VirtualFs::derived`, as the agent's skills are) is the
    /// one computed afresh after any sequence of changes, in the fs and in a copy of it changed
    /// apart.
    #[test]
    fn fs_derived_values_follow_every_change(
        ops in prop::collection::vec((0u8..5, "/[ab]{1,2}(/[ab]{1,2}){0,2}"), 1..24),
        copy_at in 0usize..24,
    ) {
        let clock = Clock::new(0);
        let mut fs = VirtualFs::new();
        let mut copy: Option<VirtualFs> = None;
        let derived = |fs: &VirtualFs| fs.derived("walk", |fs| format!("{:?}", fs.walk("/").unwrap()));
        for (i, (op, path)) in ops.iter().enumerate() {
            prop_assert_eq!(derived(&fs), format!("{:?}", fs.walk("/").unwrap()));
            if i == copy_at {
                copy = Some(fs.clone());
            }
            let _ = match op {
                0 => fs.write(path, format!("written {i}"), &clock),
                1 => fs.remove(path, &clock),
                2 => fs.create_dir(path),
                3 => fs.edit(path, "written", "edited", true, &clock).map(|_| ()),
                _ => fs.seed(path, "seeded", &clock),
            };
            if let Some(copy) = &mut copy {
                prop_assert_eq!(derived(copy), format!("{:?}", copy.walk("/").unwrap()));
                let _ = copy.write(&format!("{path}.copy"), "apart", &clock);
                prop_assert_eq!(derived(copy), format!("{:?}", copy.walk("/").unwrap()));
            }
        }
        prop_assert_eq!(derived(&fs), format!("{:?}", fs.walk("/").unwrap()));
    }
}

// ---- rng -------------------------------------------------------------------------------------

fn draws(rng: &mut Rng, n: usize) -> Vec<u64> {
    (0..n).map(|_| rng.next_u64()).collect()
}

#[test]
fn rng_is_a_fixed_function_of_the_seed() {
    // Pinned: changing the algorithm would change every scenario's draws.
    let mut rng = Rng::new(7);
    let first = rng.next_u64();
    assert_eq!(Rng::new(7).next_u64(), first);
    assert_ne!(Rng::new(8).next_u64(), first);
    insta::assert_snapshot!(format!("{first:#018x}"), @"0xb358faf74ef9765a");
}

#[test]
fn rng_helpers_stay_in_bounds() {
    let mut rng = Rng::new(1);
    for _ in 0..1000 {
        let n = rng.range(10..13);
        assert!((10..13).contains(&n));
        let x = rng.next_f64();
        assert!((0.0..1.0).contains(&x));
    }
    assert!(!rng.chance(0.0));
    assert!(rng.chance(1.0));
    assert_eq!(rng.pick::<u8>(&[]), None);
    assert_eq!(rng.pick(&[5]), Some(&5));
}

proptest! {
    #[test]
    fn rng_forks_are_independent(seed in any::<u64>(), drawn_from_a in 0usize..50, drawn_from_parent in 0usize..50) {
        let root = Rng::new(seed);
        let expected_b = draws(&mut root.fork("b"), 8);

        let mut parent = Rng::new(seed);
        let mut a = parent.fork("a");
        draws(&mut a, drawn_from_a);
        draws(&mut parent, drawn_from_parent);
        let mut b = parent.fork("b");
        prop_assert_eq!(draws(&mut b, 8), expected_b.clone());
        prop_assert_ne!(draws(&mut root.fork("a"), 8), expected_b);
    }
}

// ---- scripted model --------------------------------------------------------------------------

#[test]
fn replies_are_consumed_in_order_per_lane() {
    let mut model = ScriptedModel::new(Rng::new(0));
    model.push("main", Reply::text("one"));
    model.push("compact", Reply::text("<summary>s</summary>"));
    model.push("main", Reply::new(vec![ContentBlock::tool_use("toolu_1", "Read", serde_json::json!({}))]));
    assert_eq!(*model.next_reply("main").unwrap().content, [ContentBlock::text("one")]);
    let second = model.next_reply("main").unwrap();
    assert_eq!(second.stop_reason, StopReason::ToolUse);
    assert_eq!(model.unconsumed(), [("compact".to_owned(), 1)]);
    assert_eq!(
        model.next_reply("main").unwrap_err().to_string(),
        "failed to get a model reply on lane `main`: the script has no reply left (it had 2)"
    );
    assert_eq!(
        model.next_reply("subagent:explore").unwrap_err().to_string(),
        "failed to get a model reply on lane `subagent:explore`: the script has no replies for this lane (scripted lanes: compact, main)"
    );
}

#[test]
fn output_tokens_are_estimated_as_chars_over_four() {
    assert_eq!(Reply::text("12345678").output_tokens, 2);
    assert_eq!(Reply::text("123456789").output_tokens, 3);
}

#[test]
fn fallback_synthesizes_deterministic_replies_independent_of_call_order() {
    let synth = |order: &[&str]| {
        let mut model = ScriptedModel::new(Rng::new(9)).with_fallback(Fallback::Synthesize(Synthesis {
            reply_tokens: 10,
            summary_tokens: 100,
            after_script_ends: false,
        }));
        model.push("main", Reply::text("scripted"));
        let mut out = std::collections::BTreeMap::new();
        for lane in order {
            let reply = model.next_reply(lane);
            out.entry(lane.to_string()).or_insert_with(Vec::new).push(reply.map(|r| (r.content, r.synthetic, r.output_tokens)).map_err(|e| e.to_string()));
        }
        out
    };
    let a = synth(&["compact", "side", "compact", "main", "main"]);
    let b = synth(&["main", "side", "compact", "compact", "main"]);
    assert_eq!(a, b);
    let compact = a["compact"][0].as_ref().unwrap();
    assert!(compact.1, "synthetic");
    let ContentBlock::Text { text, .. } = &compact.0[0] else { panic!("text reply") };
    assert!(text.starts_with("<summary>\n") && text.ends_with("\n</summary>"));
    assert!((100..=110).contains(&compact.2), "about 100 tokens, got {}", compact.2);
    assert_ne!(a["compact"][0], a["compact"][1], "each reply draws its own text");
    // A scripted lane that ran out still errors unless after_script_ends.
    assert!(a["main"][1].is_err());
}

// ---- normal paths and the read-file check ----------------------------------------------------

/// `normalize_path` as it was before its fast path for normal paths: the reference it must
/// still agree with.
fn normalize_path_by_parts(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

/// One step of a fs's life and the agent's reads, for the read-file check's property.
#[derive(Debug, Clone)]
enum ReadStep {
    Write(usize),
    Seed(usize, i64),
    Remove(usize),
    /// The agent reads the file (noting its mtime now) under one of its spellings.
    Read(usize, usize),
    /// The agent notes a path at an mtime of its own (a resume rebuilds reads from the
    /// transcript, at the time of each record).
    ReadAt(usize, usize, i64),
    Check,
    /// The fs is replaced by a copy of itself (a copy changes apart from its original).
    Copy,
    Advance(u64),
}

const READ_PATHS: [&str; 4] = ["/p/a.txt", "/p/b.txt", "/p/d/c.md", "/q.md"];

/// Ways to name a path: as it is, and not normal.
fn spelling(path: &str, way: usize) -> String {
    match way % 3 {
        0 => path.to_owned(),
        1 => path.replacen('/', "//", 1),
        _ => format!("/p/..{path}"),
    }
}

fn read_step() -> impl Strategy<Value = ReadStep> {
    let file = 0..READ_PATHS.len();
    prop_oneof![
        file.clone().prop_map(ReadStep::Write),
        (file.clone(), -5i64..50).prop_map(|(f, t)| ReadStep::Seed(f, t)),
        file.clone().prop_map(ReadStep::Remove),
        (file.clone(), 0usize..3).prop_map(|(f, w)| ReadStep::Read(f, w)),
        (file, 0usize..3, -5i64..50).prop_map(|(f, w, t)| ReadStep::ReadAt(f, w, t)),
        Just(ReadStep::Check),
        Just(ReadStep::Copy),
        (0u64..3).prop_map(ReadStep::Advance),
    ]
}

proptest! {
    #[test]
    fn normalize_path_agrees_with_normalizing_by_parts(
        parts in prop::collection::vec(prop::sample::select(vec!["", ".", "..", "...", "a", "bc", ".d", "e.", "f g"]), 0..7),
        absolute in any::<bool>(),
    ) {
        let path = format!("{}{}", if absolute { "/" } else { "" }, parts.join("/"));
        let expect = normalize_path_by_parts(&path);
        prop_assert_eq!(ctxsim::world::normalize_path(&path).ok(), expect.clone());
        prop_assert_eq!(ctxsim::world::is_normal_path(&path), expect.as_deref() == Some(path.as_str()));
    }

    /// The read-file check looks only at what changed since the last one, and finds what a look
    /// at every file read finds.
    #[test]
    fn read_check_finds_what_a_look_at_every_read_file_finds(steps in prop::collection::vec(read_step(), 0..40)) {
        use ctxsim::agent::read_state::ReadState;
        let mut clock = Clock::new(0);
        let mut fs = VirtualFs::new();
        let mut reads = ReadState::default();
        let mut expect: std::collections::BTreeMap<String, i64> = std::collections::BTreeMap::new();
        for step in steps {
            match step {
                ReadStep::Write(f) => { let _ = fs.write(READ_PATHS[f], format!("{f} at {}", clock.now_ms()), &clock); }
                ReadStep::Seed(f, t) => { let _ = fs.seed_at(READ_PATHS[f], "seeded", t); }
                ReadStep::Remove(f) => { let _ = fs.remove(READ_PATHS[f], &clock); }
                ReadStep::Read(f, way) => {
                    let path = spelling(READ_PATHS[f], way);
                    if let Ok(entry) = fs.entry(&path) {
                        reads.insert(path.clone(), entry.mtime_ms);
                        expect.insert(path, entry.mtime_ms);
                    }
                }
                ReadStep::ReadAt(f, way, t) => {
                    let path = spelling(READ_PATHS[f], way);
                    reads.insert(path.clone(), t);
                    expect.insert(path, t);
                }
                ReadStep::Check => {
                    let mut changed = Vec::new();
                    for (path, seen) in expect.iter_mut() {
                        let Ok(entry) = fs.entry(path) else { continue };
                        if entry.mtime_ms > *seen {
                            *seen = entry.mtime_ms;
                            changed.push((path.clone(), entry.contents.to_string()));
                        }
                    }
                    let got: Vec<(String, String)> = reads.take_changed(&fs).into_iter().map(|(p, e)| (p, e.contents.to_string())).collect();
                    prop_assert_eq!(got, changed);
                }
                ReadStep::Copy => fs = fs.clone(),
                ReadStep::Advance(ms) => clock.advance(ms),
            }
        }
        let seen: std::collections::BTreeMap<String, i64> = reads.iter().map(|(p, t)| (p.clone(), *t)).collect();
        prop_assert_eq!(seen, expect);
    }
}

/// A value derived from what it read is taken again (the same value, not computed anew) after
/// changes of other files and in a copy of the tree; a change of a file it read, or a new file
/// in a directory it walked, computes it again.
#[test]
fn a_value_derived_by_reads_is_taken_again_while_its_reads_read_the_same() {
    use std::sync::Arc;
    type Memory = Arc<(String, Vec<String>, bool)>;
    let (mut fs, clock) = fs_with(&["/p/CLAUDE.md", "/p/.claude/rules/a.md", "/p/src/main.rs"]);
    let derive = |fs: &VirtualFs| -> Memory {
        fs.derived_by_reads("test::memory", |reads| {
            let text = reads.read("/p/CLAUDE.md").unwrap_or_default().to_owned();
            let rules: Vec<String> = reads.walk("/p/.claude/rules").unwrap_or_default().into_iter().map(|e| e.path).collect();
            let local = reads.read("/p/CLAUDE.local.md").is_ok();
            Arc::new((text, rules, local))
        })
    };
    let first = derive(&fs);
    fs.write("/p/src/main.rs", "fn main() {}", &clock).unwrap();
    assert!(Arc::ptr_eq(&derive(&fs), &first), "another file changed: taken again");
    assert!(Arc::ptr_eq(&derive(&fs.clone()), &first), "a copy of the tree: taken again");
    fs.write("/p/CLAUDE.local.md", "local", &clock).unwrap();
    let local = derive(&fs);
    assert!(!Arc::ptr_eq(&local, &first) && local.2, "a file it looked for appeared: computed again");
    fs.write("/p/.claude/rules/b.md", "b", &clock).unwrap();
    assert_eq!(derive(&fs).1, vec!["/p/.claude/rules/a.md".to_owned(), "/p/.claude/rules/b.md".to_owned()], "a file in a directory it walked");
    fs.write("/p/CLAUDE.md", "changed", &clock).unwrap();
    assert_eq!(derive(&fs).0, "changed", "a file it read changed");
}

proptest! {
    /// A value derived by reads is, after any run of writes, removals and directories made
    /// (in the tree and in copies of it), the value computing it afresh gives: a check that
    /// skips reading again where no change reached a read never keeps a stale value.
    #[test]
    fn a_value_derived_by_reads_follows_every_change(ops in proptest::collection::vec((0u8..4, 0usize..8), 1..40)) {
        const PATHS: [&str; 8] = ["/p/a", "/p/d/x", "/p/d/e/y", "/q/x", "/q/z", "/p/d", "/pd/x", "/p/d2"];
        let (mut fs, clock) = fs_with(&["/p/a", "/q/x"]);
        let compute = |reads: &ctxsim::world::Reads<'_>| {
            let a = reads.read("/p/a").ok().map(str::to_owned);
            let listed: Vec<String> = reads.list_dir("/p").unwrap_or_default().into_iter().map(|e| e.path).collect();
            let walked: Vec<String> = reads.walk("/p/d").unwrap_or_default().into_iter().map(|e| e.path).collect();
            let x = reads.read("/q//x").ok().map(str::to_owned);
            (a, listed, walked, x)
        };
        for (n, (op, at)) in ops.into_iter().enumerate() {
            let path = PATHS[at];
            match op {
                0 => { let _ = fs.write(path, format!("v{}", n % 3), &clock); }
                1 => { let _ = fs.remove(path, &clock); }
                2 => { let _ = fs.create_dir(path); }
                _ => fs = fs.clone(),
            }
            let kept = fs.derived_by_reads("test::follows", compute);
            prop_assert_eq!(kept, compute(&ctxsim::world::Reads::untracked(&fs)));
        }
    }
}
