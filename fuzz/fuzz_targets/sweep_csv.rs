#![no_main]
//! The `sweep_csv` reader on arbitrary bytes: `ctxsim::fuzzing::sweep_csv` checks its promises.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ctxsim::fuzzing::sweep_csv(data);
});
