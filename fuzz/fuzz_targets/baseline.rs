#![no_main]
//! The `baseline` reader on arbitrary bytes: `ctxsim::fuzzing::baseline` checks its promises.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ctxsim::fuzzing::baseline(data);
});
