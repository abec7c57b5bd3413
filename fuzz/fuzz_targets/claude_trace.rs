#![no_main]
//! The `claude_trace` reader on arbitrary bytes: `ctxsim::fuzzing::claude_trace` checks its promises.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ctxsim::fuzzing::claude_trace(data);
});
