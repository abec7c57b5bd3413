use clap::Parser;

// The replay allocates and frees many short-lived strings and messages per call; mimalloc does
// that in about 20% less CPU than the system allocator on `ctxsim audit` (benches/README.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    small_pages_only();
    let cli = ctxsim::cli::Cli::parse();
    if ctxsim::cli::keeps_freed_memory(&cli) {
        keep_freed_memory();
    }
    let code = match ctxsim::cli::run(cli) {
        Ok(code) => code,
        // The reader of stdout went away (`| head`): what it read was complete; not a failure.
        Err(error) if ctxsim::cli::is_broken_pipe(&error) => ctxsim::cli::exit::OK,
        Err(error) => {
            eprintln!("error: {error:#}");
            ctxsim::cli::exit::BAD_INPUT
        }
    };
    std::process::exit(code);
}

/// No transparent huge pages for this process (`prctl(PR_SET_THP_DISABLE)`, what mimalloc's
/// `MIMALLOC_ALLOW_THP=0` does at its start): mimalloc asks for huge pages on its arenas, and
/// the kernel then zeroes 2 MiB at the first touch of any part of one, again after mimalloc
/// gives freed memory back; on `ctxsim audit` that zeroing was ~10% of the CPU samples, 1–9%
/// without it; the effect on CPU and wall time was within the noise of a loaded machine and is
/// not settled (benches/README.md, "audit"). Only the speed changes.
/// `MIMALLOC_ALLOW_THP` in the environment is left to mimalloc. Inherited by child processes.
#[cfg(target_os = "linux")]
fn small_pages_only() {
    use std::ffi::{c_int, c_ulong};
    unsafe extern "C" {
        fn prctl(option: c_int, ...) -> c_int;
    }
    const PR_SET_THP_DISABLE: c_int = 41;
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: this option only sets a flag of the calling process; a kernel without it
        // returns an error, ignored (huge pages stay allowed).
        let (on, unused): (c_ulong, c_ulong) = (1, 0);
        unsafe {
            prctl(PR_SET_THP_DISABLE, on, unused, unused, unused);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn small_pages_only() {}

/// mimalloc keeps the memory the program frees for its own reuse instead of giving it back to
/// the system (`mi_option_purge_delay` = -1, what `MIMALLOC_PURGE_DELAY=-1` does): an audit
/// frees a session's import and replays when its row is made, and the next session's would
/// otherwise fault in fresh, zeroed pages for them (`ctxsim audit --no-cache` on the 16 real
/// sessions: ~60,000 page faults and ~1% of the CPU in `madvise` at mimalloc's default, ~45,000
/// and none without purging; benches/README.md, "audit"). The cost: what is freed is held until
/// the process ends, so the peak memory rises (~175 → ~205 MB there). Only for batch commands (`cli::keeps_freed_memory`), not the
/// long-running ones, and only while a batch is short: one that replays more than
/// `cli::LONG_BATCH_SESSIONS` sessions purges again (`cli::ON_LONG_BATCH`), what it holds
/// would otherwise creep up with the sessions. `MIMALLOC_PURGE_DELAY` in the environment is left
/// to mimalloc.
fn keep_freed_memory() {
    use std::ffi::{c_int, c_long};
    unsafe extern "C" {
        fn mi_option_set(option: c_int, value: c_long);
    }
    // `mi_option_purge_delay` in mimalloc 3's `mi_option_t` (libmimalloc-sys 0.1.49).
    const MI_OPTION_PURGE_DELAY: c_int = 15;
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one of mimalloc's options, read when it decides to purge.
        unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, -1) }
        // A long run gives freed memory back after mimalloc's default delay (10 ms).
        let _ = ctxsim::cli::ON_LONG_BATCH.set(|| {
            // SAFETY: as above.
            unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, 10) }
        });
    }
}
