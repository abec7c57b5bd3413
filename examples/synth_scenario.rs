//! Prints a generated scenario of N scripted turns (`ctxsim::synth::scripted_scenario`), for
//! measuring `ctxsim run` on long scripts: `cargo run --example synth_scenario -- 2000 > s.yaml`.
//! A third argument `growing` prints the same script with nothing compacting
//! (`ctxsim::synth::growing_scripted_scenario`): `... -- 2000 7 growing`.
fn main() {
    let turns: usize = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(1_000);
    let seed: u64 = std::env::args().nth(2).and_then(|n| n.parse().ok()).unwrap_or(7);
    let growing = std::env::args().nth(3).is_some_and(|a| a == "growing");
    let text = if growing { ctxsim::synth::growing_scripted_scenario(seed, turns) } else { ctxsim::synth::scripted_scenario(seed, turns) };
    print!("{text}");
}
