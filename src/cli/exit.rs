//! The process exit codes (CONTRACT.md), in one place. Clap's own usage errors exit with 2 too.

/// Success.
pub const OK: i32 = 0;
/// A check failed: a regression, a budget exceeded, a fidelity below the bar given.
pub const CHECK_FAILED: i32 = 1;
/// Bad usage or bad input; the message names the file, line and field.
pub const BAD_INPUT: i32 = 2;
