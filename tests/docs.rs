//! The user documents speak to users: no words about how the project is built (its issue numbers,
//! "part N", rules defined elsewhere, commit hashes, "these machines", sessions).
#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;

fn user_documents() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "md") {
            files.push(e.path());
        }
    }
    files
}

/// `word` followed by a space and a digit (`issue 17`, `part 3`, `rule 1`), case-insensitive.
fn numbered(line: &str, word: &str) -> bool {
    let lower = line.to_lowercase();
    let pat = format!("{word} ");
    lower.match_indices(&pat).any(|(i, _)| {
        let before_ok = i == 0 || !lower.as_bytes()[i - 1].is_ascii_alphanumeric();
        before_ok
            && lower[i + pat.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
    })
}

/// A word of 7 to 40 hex digits holding both a digit and a letter: a commit hash.
fn commit_like(line: &str) -> Option<&str> {
    line.split(|c: char| !c.is_ascii_alphanumeric()).find(|w| {
        // The signature scheme's name is all hex digits too.
        !w.eq_ignore_ascii_case("ed25519")
            && (7..=40).contains(&w.len())
            && w.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
            && w.chars().any(|c| c.is_ascii_digit())
            && w.chars().any(|c| c.is_ascii_alphabetic())
    })
}

#[test]
fn user_documents_hold_no_internal_words() {
    let mut found = Vec::new();
    for file in user_documents() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            let mut why = Vec::new();
            for word in ["issue", "part", "rule"] {
                if numbered(line, word) {
                    why.push(format!("'{word} N'"));
                }
            }
            if line.contains("DESIGN.md") {
                why.push("DESIGN.md".to_owned());
            }
            for phrase in ["these machines", "session", "closing note"] {
                if lower.contains(phrase) {
                    why.push(format!("'{phrase}'"));
                }
            }
            if let Some(h) = commit_like(line) {
                why.push(format!("commit-like {h}"));
            }
            if !why.is_empty() {
                found.push(format!(
                    "{}:{}: {} in: {line}",
                    file.display(),
                    n + 1,
                    why.join(", ")
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "internal words in user documents:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checks_catch_what_they_name() {
    assert!(numbered("see issue 17's note", "issue"));
    assert!(numbered("Part 3 adds", "part"));
    assert!(!numbered("a partition 3", "part"));
    assert!(!numbered("etcd-io/etcd#13766", "issue"));
    assert_eq!(commit_like("commit 67703af landed"), Some("67703af"));
    assert_eq!(commit_like("revision 1000000000"), None);
}

/// README is for deciding and starting: under 150 lines, everything else in docs/.
#[test]
fn readme_stays_under_150_lines() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let n = readme.lines().count();
    assert!(n < 150, "README.md has {n} lines: move detail to docs/");
}
