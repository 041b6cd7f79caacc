//! The tree keeps its layers: every room of `src/` imports only rooms in earlier rows of
//! docs/design.md's table ("The tree"), so no two rooms import each other, directly or through
//! others, and no part reaches up into the commands. Read from the sources' `crate::` paths
//! (outside comments and test modules) and from the table itself, so the map cannot drift from the
//! code.
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The rows of the table, bottom up: each row's rooms (`backup/` and `telemetry` alike, without
/// the slash).
fn rows() -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(root().join("docs/design.md")).unwrap();
    let start = text
        .find("## The tree")
        .expect("docs/design.md has a section \"The tree\"");
    let mut rows = Vec::new();
    for line in text[start..].lines().skip(1) {
        if line.starts_with("## ") {
            break;
        }
        let Some(first) = line.strip_prefix("| ").and_then(|l| l.split(" | ").next()) else {
            continue;
        };
        if first == "room" || first.starts_with("---") {
            continue;
        }
        let rooms: Vec<String> = first
            .split(',')
            .map(|r| r.trim().trim_matches('`').trim_end_matches('/').to_owned())
            .filter(|r| !r.is_empty())
            .collect();
        rows.push(rooms);
    }
    assert!(
        rows.len() > 5,
        "the table of docs/design.md's \"The tree\" has {} rows",
        rows.len()
    );
    rows
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file without its test module and its comments.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.trim_start().starts_with("//") {
            true => "",
            // A trailing comment; `http://` has no space before its slashes.
            false => l.find(" // ").map_or(l, |i| &l[..i]),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The rooms a file's code names through `crate::room` or `crate::{room, ...}`.
fn named_rooms(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name = ident(part.trim());
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out
}

/// Room → the rooms its code imports.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .into_owned();
        let room = first.trim_end_matches(".rs").to_owned();
        if room == "main" || room == "lib" {
            continue;
        }
        let names = named_rooms(&code(&std::fs::read_to_string(&f).unwrap()));
        let entry = out.entry(room.clone()).or_default();
        entry.extend(names.into_iter().filter(|n| *n != room));
    }
    out
}

#[test]
fn every_room_imports_only_rooms_in_earlier_rows_of_the_design_table() {
    let rows = rows();
    let row_of: BTreeMap<&str, usize> = rows
        .iter()
        .enumerate()
        .flat_map(|(i, r)| r.iter().map(move |room| (room.as_str(), i)))
        .collect();
    let imports = imports();
    let mut wrong = Vec::new();
    for (room, names) in &imports {
        let Some(&mine) = row_of.get(room.as_str()) else {
            wrong.push(format!(
                "src/{room} is in no row of docs/design.md's table: add it where it belongs"
            ));
            continue;
        };
        for name in names {
            // `crate::` followed by something that is no room (a macro path, a re-export) is not
            // an arrow between rooms.
            let Some(&theirs) = row_of.get(name.as_str()) else {
                continue;
            };
            if theirs >= mine {
                wrong.push(format!(
                    "{room} (row {mine}) imports {name} (row {theirs}): a room calls only rooms in earlier rows"
                ));
            }
        }
    }
    for row in &rows {
        for room in row {
            assert!(
                imports.contains_key(room),
                "docs/design.md's table names {room}, which src/ does not have"
            );
        }
    }
    assert!(
        wrong.is_empty(),
        "the tree breaks its layers:\n{}",
        wrong.join("\n")
    );
}

/// The check above would pass vacuously if the parsing found nothing: the rooms it reads import
/// each other as the table says.
#[test]
fn the_imports_are_read_from_the_code() {
    let imports = imports();
    assert!(
        imports["cmd"].contains("startup"),
        "cmd -> startup not found: {:?}",
        imports["cmd"]
    );
    assert!(
        imports["backup"].contains("snapshot"),
        "backup -> snapshot not found: {:?}",
        imports["backup"]
    );
    assert!(
        imports["etcd"].contains("process"),
        "etcd -> process not found: {:?}",
        imports["etcd"]
    );
    let arrows: usize = imports.values().map(BTreeSet::len).sum();
    assert!(arrows > 80, "only {arrows} imports between rooms were read");
}
