#![no_main]
//! The `calibration` reader on arbitrary bytes: `ctxsim::fuzzing::calibration` checks its promises.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ctxsim::fuzzing::calibration(data);
});
