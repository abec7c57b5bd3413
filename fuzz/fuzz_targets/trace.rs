#![no_main]
//! The `trace` reader on arbitrary bytes: `ctxsim::fuzzing::trace` checks its promises.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ctxsim::fuzzing::trace(data);
});
