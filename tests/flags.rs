//! The etcd flag table (src/etcd/flags.tsv) against every supported etcd binary: each flag that
//! `--help` lists is in the table, and each flag of the table is read by the binary exactly as the
//! table says. How a binary reads a flag is asked of the binary itself: `etcd --version --FLAG`
//! exits 0 when FLAG is a boolean (Go's flag package sets it and etcd prints its version), says
//! "flag needs an argument" when it takes a value, and "provided but not defined" when that
//! release has no such flag.
//!
//! `UPDATE_GOLDEN=1` writes the table from what the binaries answer. `ETCD_FLAG_SOURCES` (a
//! colon-separated list of the releases' flag-defining Go files, e.g. server/embed/config.go and
//! server/etcdmain/config.go of each release) adds every quoted word of those files as a candidate,
//! so that flags `--help` does not list are found too; the binaries decide which are flags.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Read {
    Bool,
    Value,
    Undefined,
}

fn probe(etcd: &Path, flag: &str) -> Read {
    let out = Command::new(etcd)
        .arg("--version")
        .arg(format!("--{flag}"))
        .env_clear()
        .output()
        .expect("run etcd --version --FLAG");
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        Read::Bool
    } else if err.contains("flag needs an argument") {
        Read::Value
    } else if err.contains("flag provided but not defined") {
        Read::Undefined
    } else {
        panic!("{} --version --{flag}: {:?}: {err}", etcd.display(), out.status)
    }
}

fn help_flags(etcd: &Path) -> BTreeSet<String> {
    let out = Command::new(etcd)
        .arg("--help")
        .env_clear()
        .output()
        .expect("run etcd --help");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let flags: BTreeSet<String> = text
        .lines()
        // A flag's own line is indented by two spaces; its description by four.
        .filter_map(|l| l.strip_prefix("  --"))
        .filter_map(|l| l.split([' ', '\t', '=']).next())
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(
        flags.len() > 50,
        "{} --help listed only {flags:?}",
        etcd.display()
    );
    flags
}

/// `3.6` of `etcd Version: 3.6.16`.
fn minor(etcd: &Path) -> String {
    let out = Command::new(etcd)
        .arg("--version")
        .output()
        .expect("run etcd --version");
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text
        .lines()
        .find_map(|l| l.strip_prefix("etcd Version: "))
        .unwrap_or_else(|| panic!("{} --version: {text}", etcd.display()));
    v.split('.').take(2).collect::<Vec<_>>().join(".")
}

fn table_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/etcd/flags.tsv")
}

/// name → (kind, minors) from the committed table.
fn committed() -> BTreeMap<String, (String, BTreeSet<String>)> {
    std::fs::read_to_string(table_path())
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let c: Vec<&str> = l.split('\t').collect();
            (
                c[0].to_owned(),
                (c[1].to_owned(), c[2].split(' ').map(str::to_owned).collect()),
            )
        })
        .collect()
}

fn source_words() -> BTreeSet<String> {
    let Ok(list) = std::env::var("ETCD_FLAG_SOURCES") else {
        return BTreeSet::new();
    };
    let mut out = BTreeSet::new();
    for file in list.split(':').filter(|f| !f.is_empty()) {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("ETCD_FLAG_SOURCES {file}: {e}"));
        for quoted in text.split('"').skip(1).step_by(2) {
            let word = quoted.trim();
            if !word.is_empty()
                && word
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
                && word.starts_with(|c: char| c.is_ascii_lowercase())
            {
                out.insert(word.to_owned());
            }
        }
    }
    out
}

#[test]
fn the_flag_table_reads_every_flag_as_each_supported_release_does() {
    let binaries = [etcd34(), etcd35(), etcd351(), etcd35_newest(), etcd36(), etcd37()];
    let table = committed();
    let mut candidates: BTreeSet<String> = table.keys().cloned().collect();
    candidates.extend(source_words());
    // Go's flag package answers -h and -help itself (etcd prints its help and exits 0).
    candidates.extend(["h".to_owned(), "help".to_owned()]);
    let mut helps = Vec::new();
    for b in &binaries {
        let h = help_flags(b);
        candidates.extend(h.iter().cloned());
        helps.push(h);
    }

    // name → minor → how it is read (the same in every patch release of a minor).
    let mut seen: BTreeMap<String, BTreeMap<String, Read>> = BTreeMap::new();
    let mut problems = Vec::new();
    for (b, help) in binaries.iter().zip(&helps) {
        let m = minor(b);
        let reads: Vec<(String, Read)> = std::thread::scope(|s| {
            let names: Vec<&String> = candidates.iter().collect();
            let chunks: Vec<Vec<&String>> =
                names.chunks(names.len().div_ceil(8)).map(<[_]>::to_vec).collect();
            let handles: Vec<_> = chunks
                .into_iter()
                .map(|chunk| {
                    s.spawn(move || {
                        chunk
                            .into_iter()
                            .map(|n| (n.clone(), probe(b, n)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        for (name, read) in reads {
            // etcd 3.7's --help still lists the v2 discovery flags that 3.7 removed.
            let stale_help = m == "3.7" && ["discovery", "discovery-proxy"].contains(&name.as_str());
            if help.contains(&name) && read == Read::Undefined && !stale_help {
                problems.push(format!(
                    "{}: --help lists --{name}, but it is not defined",
                    b.display()
                ));
            }
            if read == Read::Undefined {
                continue;
            }
            let prev = seen.entry(name.clone()).or_default().insert(m.clone(), read);
            if prev.is_some_and(|p| p != read) {
                problems.push(format!(
                    "--{name} is read as {prev:?} and as {read:?} within etcd {m}"
                ));
            }
        }
    }
    let mut generated = String::from(
        "# Every flag of the etcd server of each supported minor release, and whether Go's flag package reads it\n\
         # as a boolean. Generated by tests/flags.rs (UPDATE_GOLDEN=1) from the releases' own flag definitions and\n\
         # binaries: etcd 3.4.23, 3.5.1, 3.5.16, the newest 3.5 of Debian sid, 3.6.16, 3.7.3. Do not edit.\n\
         # name\tkind\treleases\n",
    );
    for (name, by_minor) in &seen {
        let kinds: BTreeSet<Read> = by_minor.values().copied().collect();
        if kinds.len() > 1 {
            problems.push(format!(
                "--{name} is a boolean in one release and takes a value in another: {by_minor:?}"
            ));
        }
        let kind = if kinds.contains(&Read::Bool) {
            "bool"
        } else {
            "value"
        };
        let minors: Vec<&str> = by_minor.keys().map(String::as_str).collect();
        generated.push_str(&format!("{name}\t{kind}\t{}\n", minors.join(" ")));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(table_path(), &generated).unwrap();
    }
    let now = std::fs::read_to_string(table_path()).unwrap_or_default();
    if now != generated {
        let old: BTreeSet<&str> = now.lines().collect();
        let new: BTreeSet<&str> = generated.lines().collect();
        panic!(
            "src/etcd/flags.tsv differs from what the binaries answer (UPDATE_GOLDEN=1 rewrites it):\n  only in the file: {:?}\n  only in the binaries: {:?}",
            old.difference(&new).collect::<Vec<_>>(),
            new.difference(&old).collect::<Vec<_>>()
        );
    }
}
