//! Imports each transcript named (`cargo run --release --example import_probe -- [--digest] FILE...`)
//! and, with `--digest`, prints a digest of what the import gave (recording, calls, report, as
//! debug-printed): the same digest before and after a change to the importer means the same
//! imported sessions. Without it only the import runs (for callgrind).
use std::hash::{Hash, Hasher};

fn main() {
    let mut digest = false;
    for arg in std::env::args().skip(1) {
        if arg == "--digest" {
            digest = true;
            continue;
        }
        let session = ctxsim::recording::import_claude_code(std::path::Path::new(&arg)).expect("an import");
        if digest {
            let text = format!("{:?}\n{:?}\n{:?}\n{:?}", session.recording, session.calls, session.report, session.api_requests);
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            text.hash(&mut hasher);
            println!("{:016x} {} {arg}", hasher.finish(), text.len());
        }
    }
}
