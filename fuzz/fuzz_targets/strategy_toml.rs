#![no_main]
//! The `strategy_toml` reader on arbitrary bytes: `ctxsim::fuzzing::strategy_toml` checks its promises.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ctxsim::fuzzing::strategy_toml(data);
});
