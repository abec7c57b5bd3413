#![no_main]
//! The `shapes` reader on arbitrary bytes: `ctxsim::fuzzing::shapes` checks its promises.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ctxsim::fuzzing::shapes(data);
});
