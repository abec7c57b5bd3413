//! `run` keeps memory linear in script length: a body holds the conversation so far, so a run
//! that kept every body grew with the square of the script (issue 14: 2,000 turns 1.9 GB). The
//! test binary counts the bytes each thread holds; a run is single-threaded.
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use ctxsim::agent::compact::Chain;
use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::runner::{RunOptions, run_scenario, run_scenario_opts};
use ctxsim::scenario::parse_scenario;
use ctxsim::strategy::Strategy;

struct Counting;

thread_local! {
    static HELD: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn note(delta: isize) {
    // `try_with`: a thread being torn down has no counters any more.
    let _ = HELD.try_with(|held| {
        let now = held.get() + delta;
        held.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every call is forwarded to the system allocator unchanged; the counters are
// thread-local cells that allocate nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as isize);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(-(layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes this thread held at its peak while `f` ran, above what it held before.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let start = HELD.with(Cell::get);
    PEAK.with(|p| p.set(start));
    let out = f();
    (out, (PEAK.with(Cell::get) - start).max(0) as usize)
}

fn measurer() -> Measurer {
    Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4))
}

/// Doubling the script doubles `run`'s memory (plus a little), where keeping every body
/// multiplies it by about three; the streamed information loss equals the one computed from
/// the kept bodies.
#[test]
fn run_memory_grows_linearly_with_script_length() {
    let scenario = |turns| parse_scenario(&ctxsim::synth::scripted_scenario(7, turns), "synth.yaml").unwrap();
    let strategy = Strategy::default();
    let streamed = |turns| {
        let scenario = scenario(turns);
        peak_during(|| run_scenario_opts(&scenario, &mut measurer(), &strategy, &Chain::new(), RunOptions { info_loss: true, ..RunOptions::default() }).unwrap())
    };
    let kept = |turns| {
        let scenario = scenario(turns);
        peak_during(|| run_scenario(&scenario, &mut measurer(), &strategy).unwrap())
    };
    let ((small, small_peak), (large, large_peak)) = (streamed(60), streamed(120));
    let ((kept_small, kept_small_peak), (kept_large, kept_large_peak)) = (kept(60), kept(120));
    assert!(small.requests.is_empty() && large.requests.is_empty(), "no body kept");
    assert_eq!(kept_large.requests.len(), kept_large.rows.len());
    // The same run either way: rows, fingerprint and the information loss.
    assert_eq!(serde_json::to_string(&large.rows).unwrap(), serde_json::to_string(&kept_large.rows).unwrap());
    assert_eq!(large.summary.fingerprint, kept_large.summary.fingerprint);
    let loss = ctxsim::measure::loss::info_loss(&kept_large.requests, &kept_large.rows);
    assert_eq!(large.summary.info_loss, loss);
    let _ = (small, kept_small);
    let ratio = large_peak as f64 / small_peak as f64;
    let kept_ratio = kept_large_peak as f64 / kept_small_peak as f64;
    eprintln!("peak bytes: streamed {small_peak} → {large_peak} ({ratio:.2}×), kept {kept_small_peak} → {kept_large_peak} ({kept_ratio:.2}×)");
    assert!(ratio < 2.4, "streamed: {small_peak} → {large_peak} bytes ({ratio:.2}×)");
    assert!(kept_large_peak > 3 * large_peak, "keeping every body costs more: {kept_large_peak} vs {large_peak}");
}

/// The bodies a run sends share their history: every message's blocks are one allocation from
/// the request that first sent them on, so the distinct block lists over all the bodies of a
/// run grow with the conversation plus a few per request (the tail the agent normalizes again,
/// the message that carries the marker), not with requests × messages. This is what lets a run
/// hold one conversation, and the measurement compare a request with the previous one by
/// pointer. Checked on the script where nothing compacts, at two lengths.
#[test]
fn run_bodies_share_their_history_so_distinct_block_lists_grow_linearly() {
    use ctxsim::api::{ContentBlock, MessageContent, SharedBlocks};
    let strategy = Strategy::default();
    let count = |turns| {
        let scenario = parse_scenario(&ctxsim::synth::growing_scripted_scenario(7, turns), "synth.yaml").unwrap();
        // Kept alive while counting, so that an address cannot be reused by a later list.
        let mut seen: std::collections::HashMap<*const Vec<ContentBlock>, SharedBlocks> = Default::default();
        let (mut slots, mut requests, mut last) = (0usize, 0usize, 0usize);
        let mut observer = |request: &ctxsim::api::Request, _: &ctxsim::measure::RequestMetrics| {
            requests += 1;
            last = request.messages.len();
            for message in &request.messages {
                if let MessageContent::Blocks(blocks) = &message.content {
                    slots += 1;
                    seen.entry(std::ptr::from_ref::<Vec<ContentBlock>>(blocks)).or_insert_with(|| blocks.clone());
                }
            }
        };
        let options = RunOptions { observer: Some(&mut observer), ..RunOptions::default() };
        let output = run_scenario_opts(&scenario, &mut measurer(), &strategy, &Chain::new(), options).unwrap();
        assert!(output.requests.is_empty(), "no body kept");
        assert!(output.summary.compactions.values().all(|n| *n == 0), "nothing compacts in this script: {:?}", output.summary.compactions);
        (seen.len(), slots, requests, last)
    };
    let (small @ (distinct_small, slots_small, requests_small, _), large @ (distinct_large, slots_large, requests_large, last_large)) = (count(60), count(120));
    eprintln!("distinct block lists, block-list slots, requests, last body's messages: {small:?} → {large:?}");
    assert_eq!(requests_large, 2 * requests_small, "two main requests a turn");
    // Requests × messages: quadratic in the script.
    assert!(slots_large > 3 * slots_small, "{slots_small} → {slots_large}");
    // One list per message of the conversation plus at most two new ones per request (measured:
    // 860 lists for 480 messages and 240 requests).
    assert!(distinct_large <= last_large + 2 * requests_large, "{distinct_large} lists for {last_large} messages and {requests_large} requests");
    assert!(distinct_large * 10 < slots_large, "{distinct_large} distinct of {slots_large}");
    let ratio = distinct_large as f64 / distinct_small as f64;
    assert!(ratio < 2.2, "distinct block lists {distinct_small} → {distinct_large} ({ratio:.2}×)");
}
