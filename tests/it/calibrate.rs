//! `ctxsim calibrate --from-api`: the calibrated estimator fitted against a `count_tokens`
//! endpoint (here `ctxsim serve`'s, counting with a calibration the fit must find again).

use std::path::Path;
use std::process::Command;

use ctxsim::live::{Script, ServeOptions, Service, start};
use ctxsim::measure::tokens::FamilyCalibration;
use ctxsim::measure::{Calibration, EstimatorKind, Measurer, ModelTable, TokenCounter};

use super::support::realdata;

const KEY: &str = "sk-ant-test-key-never-written-7f3a";

fn check_calibrate(base_url: Option<&str>, key: Option<&str>, out: &Path) -> std::process::Output {
    let session = realdata().join("transcripts/entireio-cli/a6e4c2a0fbd1-0.full.jsonl");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ctxsim"));
    cmd.args(["calibrate", "--from-api", "--max-texts", "12", "--output"]).arg(out).arg(&session);
    if let Some(url) = base_url {
        cmd.args(["--base-url", url]);
    }
    cmd.env_remove("ANTHROPIC_API_KEY").env_remove("ANTHROPIC_BASE_URL");
    if let Some(key) = key {
        cmd.env("ANTHROPIC_API_KEY", key);
    }
    cmd.output().unwrap()
}

#[test]
fn calibrate_from_api_finds_the_endpoints_own_calibration_and_writes_no_key() {
    // The endpoint counts with a calibration unlike the shipped one: the fit must find it.
    let mut truth = Calibration::shipped();
    let wanted = FamilyCalibration { scale: 1.3, per_block: 9.0 };
    truth.default = wanted;
    for family in truth.families.values_mut() {
        *family = wanted;
    }
    let measurer = Measurer::new(ModelTable::shipped(), TokenCounter::with_calibration(EstimatorKind::Calibrated, truth));
    let script = Script::parse("{}", "script.json").unwrap();
    let handle = start(0, Service::new(script, measurer, ServeOptions::default()).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("calibration.json");
    let output = check_calibrate(Some(&handle.base_url()), Some(KEY), &out);
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    let text = std::fs::read_to_string(&out).unwrap();
    for shown in [&text, &stdout.to_string(), &stderr.to_string()] {
        assert!(!shown.contains(KEY), "the key was written: {shown}");
    }
    let fitted = Calibration::load(&out).unwrap();
    // The session calls one family (Opus 4.5): fitted to the endpoint, within its rounding.
    let family = fitted.families.get("opus").unwrap_or_else(|| panic!("no opus family in {text}"));
    assert!((family.scale - wanted.scale).abs() < 0.005, "{family:?}");
    assert!((family.per_block - wanted.per_block).abs() < 1.0, "{family:?}");
    assert!(fitted.source.contains("calibrate --from-api") && fitted.source.contains("12 texts"), "{}", fitted.source);
    // The rest is the shipped calibration's.
    let shipped = Calibration::shipped();
    assert_eq!((fitted.default, fitted.user_context_tokens, &fitted.prefix_tokens), (shipped.default, shipped.user_context_tokens, &shipped.prefix_tokens));
    assert!(stdout.contains("opus"), "{stdout}");
    handle.stop().unwrap();
}

#[test]
fn calibrate_from_api_without_a_key_is_bad_usage() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("calibration.json");
    let output = check_calibrate(Some("http://127.0.0.1:9"), None, &out);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("ANTHROPIC_API_KEY"));
    assert!(!out.exists());
}
