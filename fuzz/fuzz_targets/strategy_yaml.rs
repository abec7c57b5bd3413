#![no_main]
//! The `strategy_yaml` reader on arbitrary bytes: `ctxsim::fuzzing::strategy_yaml` checks its promises.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ctxsim::fuzzing::strategy_yaml(data);
});
