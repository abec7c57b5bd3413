use anyhow::Context;

use crate::measure::TokenCounter;

use super::args::TokensArgs;

pub fn run(args: TokensArgs) -> anyhow::Result<i32> {
    let counter = TokenCounter::new(args.estimator.into());
    let mut total = 0u64;
    for path in &args.files {
        let text = std::fs::read_to_string(path).with_context(|| format!("failed to read {}", path.display()))?;
        let n = counter.count_text(&text, &args.family);
        total += u64::from(n);
        outln!("{n:>10}  {}", path.display());
    }
    if args.files.len() > 1 {
        outln!("{total:>10}  total");
    }
    outln!("estimator: {}, family {}", crate::measure::EstimatorKind::from(args.estimator).name(), args.family);
    Ok(0)
}
