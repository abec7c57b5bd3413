#![no_main]
//! The `model_table` reader on arbitrary bytes: `ctxsim::fuzzing::model_table` checks its promises.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ctxsim::fuzzing::model_table(data);
});
