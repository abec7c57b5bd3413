#![no_main]
//! The `request_log` reader on arbitrary bytes: `ctxsim::fuzzing::request_log` checks its promises.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ctxsim::fuzzing::request_log(data);
});
