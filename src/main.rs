use clap::Parser;

// The replay allocates and frees many short-lived strings and messages per call. jemalloc does
// that in less CPU than mimalloc and the system allocator on `ctxsim audit`, and touches fewer
// fresh pages: each page the kernel hands out costs a fault and its zeroing, and its freeing
// at exit (benches/README.md, "Session 45").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read once at its start (`malloc_conf`; `_RJEM_MALLOC_CONF` in the
/// environment still overrides them): a thread trims its cache of freed blocks after 4 MiB
/// allocated rather than 64 KiB (`tcache_gc_incr_bytes`). The replay frees and allocates blocks of
/// the same sizes request after request; trimmed that often, the blocks went back to the arena
/// and were fetched again. On `ctxsim audit --no-cache` over the 16 shipped sessions: 1.2% fewer
/// instructions, the same page faults; larger caches (more slots, blocks up to 1 MiB) saved 2.8%
/// but touched twice the pages, which cost more than they saved (benches/README.md, "Session 47");
/// up to 2,048 small blocks of a size rather than 200 saved 0.9% of instructions, touched 3%
/// more pages and gave the same CPU time ("Session 48").
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &u8 = &b"tcache_gc_incr_bytes:4194304\0"[0];

fn main() {
    small_pages_only();
    let cli = ctxsim::cli::Cli::parse();
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

/// No transparent huge pages for this process (`prctl(PR_SET_THP_DISABLE)`): where the kernel
/// backs anonymous memory with 2 MiB pages (`enabled` = `always`, or jemalloc's `thp:always`),
/// it zeroes 2 MiB at the first touch of any part of one. On `ctxsim audit` over the 16 shipped
/// sessions (benches/README.md, "Session 45") huge pages cut the page faults from ~18,600 to
/// ~3,000, but the zeroing moved into the faults that remain: the mean wall time was the same
/// (0.272 against 0.269 s) and the slow runs slower (the 90th percentile 0.318 against 0.286 s).
/// Only the speed changes. Inherited by child processes.
#[cfg(target_os = "linux")]
fn small_pages_only() {
    use std::ffi::{c_int, c_ulong};
    unsafe extern "C" {
        fn prctl(option: c_int, ...) -> c_int;
    }
    const PR_SET_THP_DISABLE: c_int = 41;
    // SAFETY: this option only sets a flag of the calling process; a kernel without it
    // returns an error, ignored (huge pages stay allowed).
    let (on, unused): (c_ulong, c_ulong) = (1, 0);
    unsafe {
        prctl(PR_SET_THP_DISABLE, on, unused, unused, unused);
    }
}

#[cfg(not(target_os = "linux"))]
fn small_pages_only() {}
