#![no_main]
//! The `transcript` reader on arbitrary bytes: `ctxsim::fuzzing::transcript` checks its promises.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ctxsim::fuzzing::transcript(data);
});
