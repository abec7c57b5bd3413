#![no_main]
//! The `scenario` reader on arbitrary bytes: `ctxsim::fuzzing::scenario` checks its promises.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ctxsim::fuzzing::scenario(data);
});
