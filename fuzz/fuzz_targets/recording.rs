#![no_main]
//! The `recording` reader on arbitrary bytes: `ctxsim::fuzzing::recording` checks its promises.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ctxsim::fuzzing::recording(data);
});
