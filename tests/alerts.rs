//! docs/alerts.yml checked with Prometheus' own promtool (Debian's package, `PROMTOOL_BIN`, set by
//! `source scripts/deps.sh && need_promtool`): the rules load (`promtool check rules`), and
//! `promtool test rules` runs tests/alerts/cases.yml, in which every alert fires on the series
//! that should raise it and stays silent on a close case that should not.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn promtool() -> PathBuf {
    let p = std::env::var_os("PROMTOOL_BIN")
        .map(PathBuf::from)
        .unwrap_or_default();
    assert!(
        p.is_file(),
        "PROMTOOL_BIN is not set to promtool: run `source scripts/deps.sh && need_promtool` (scripts/test does)"
    );
    p
}

fn rules() -> serde_yaml_ng::Value {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/alerts.yml")).unwrap();
    serde_yaml_ng::from_str(&text).unwrap()
}

fn alert_names(rules: &serde_yaml_ng::Value) -> BTreeSet<String> {
    rules["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap())
        .filter_map(|r| r["alert"].as_str().map(str::to_owned))
        .collect()
}

fn run(args: &[&std::ffi::OsStr]) -> (bool, String) {
    let out = Command::new(promtool())
        .args(args)
        .output()
        .expect("promtool runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_alert_rules_load_in_promtool() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/alerts.yml");
    let (ok, said) = run(&["check".as_ref(), "rules".as_ref(), file.as_os_str()]);
    let n = alert_names(&rules()).len();
    assert!(
        ok && said.contains(&format!("SUCCESS: {n} rules found")),
        "promtool check rules docs/alerts.yml:\n{said}"
    );
}

/// promtool compares annotations as text, so the cases run against a copy of the rules without
/// them (their templates are checked by `check rules` above).
#[test]
fn every_alert_fires_when_it_should_and_only_then() {
    let mut rules = rules();
    let names = alert_names(&rules);
    for g in rules["groups"].as_sequence_mut().unwrap() {
        for r in g["rules"].as_sequence_mut().unwrap() {
            r.as_mapping_mut().unwrap().remove("annotations");
        }
    }
    let cases_text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/alerts/cases.yml"))
            .unwrap();
    let cases: serde_yaml_ng::Value = serde_yaml_ng::from_str(&cases_text).unwrap();
    // Each alert has a case where it fires and one where it must not.
    let (mut fires, mut silent) = (BTreeSet::new(), BTreeSet::new());
    for t in cases["tests"].as_sequence().unwrap() {
        for a in t["alert_rule_test"].as_sequence().unwrap() {
            let name = a["alertname"].as_str().unwrap().to_owned();
            match a["exp_alerts"].as_sequence().map(Vec::len) {
                Some(0) => silent.insert(name),
                _ => fires.insert(name),
            };
        }
    }
    assert_eq!(fires, names, "alerts without a case where they fire");
    assert_eq!(silent, names, "alerts without a case where they must not fire");

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("alerts.yml"),
        serde_yaml_ng::to_string(&rules).unwrap(),
    )
    .unwrap();
    std::fs::write(dir.path().join("cases.yml"), cases_text).unwrap();
    let cases_path = dir.path().join("cases.yml");
    let (ok, said) = run(&["test".as_ref(), "rules".as_ref(), cases_path.as_os_str()]);
    assert!(
        ok && said.contains("SUCCESS"),
        "promtool test rules tests/alerts/cases.yml:\n{said}"
    );
}
