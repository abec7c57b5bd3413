use clap::Args;

use crate::strategy::presets::{PRESETS, knob_table};

use super::args::FidelityFormat;

#[derive(Debug, Args)]
pub struct StrategiesArgs {
    /// Also list the closed list of cache-break causes.
    #[arg(long)]
    pub causes: bool,
    #[arg(long, value_enum, default_value = "table")]
    pub format: FidelityFormat,
}

pub fn run(args: StrategiesArgs) -> anyhow::Result<i32> {
    let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    let knobs = knob_table(&env);
    match args.format {
        FidelityFormat::Json => {
            let presets: Vec<serde_json::Value> = PRESETS
                .iter()
                .map(|p| serde_json::json!({"id": p.id, "aliases": p.aliases, "source": p.source}))
                .collect();
            let knobs: Vec<serde_json::Value> = knobs
                .iter()
                .map(|k| {
                    let presets: serde_json::Map<String, serde_json::Value> = k.presets.iter().cloned().collect();
                    // Through the agent every knob reaches a recorded session.
                    serde_json::json!({"key": k.key, "default": k.default, "presets": presets, "real_sessions": true})
                })
                .collect();
            let engines = serde_json::json!({
                "agent": "the only engine of every command on recorded sessions (the record-based replay was removed in session 26): every knob reaches a recorded session (`real_sessions`)",
            });
            let mut out = serde_json::json!({"presets": presets, "knobs": knobs, "engines": engines});
            if args.causes {
                out["causes"] = crate::measure::CAUSES
                    .iter()
                    .map(|(id, region, description)| serde_json::json!({"id": id, "region": region.map(|r| r.as_str()), "description": description}))
                    .collect();
            }
            outln!("{}", serde_json::to_string_pretty(&out)?);
        }
        FidelityFormat::Table => {
            outln!("Presets:");
            for p in PRESETS {
                let aliases = if p.aliases.is_empty() { String::new() } else { format!(" (alias: {})", p.aliases.join(", ")) };
                outln!("  {:<30}{aliases}\n      {}", p.id, p.source);
            }
            outln!(
                "\nKnobs (dotted key = default; presets that differ). Every knob reaches a recorded session through the\n\
                 agent, the engine of what-ifs on recorded sessions (the agent runs the session under the strategy):"
            );
            for k in &knobs {
                outln!("  {} = {}", k.key, k.default);
                for (id, value) in &k.presets {
                    outln!("      {id}: {value}");
                }
            }
            if args.causes {
                outln!("\nCauses:");
                for (id, region, description) in crate::measure::CAUSES {
                    outln!("  {id:<34} {:<9} {description}", region.map(|r| r.as_str()).unwrap_or("any"));
                }
            }
        }
    }
    Ok(super::exit::OK)
}
