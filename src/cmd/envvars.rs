//! The `ETCD_WARDEN_*` variables the warden reads, and the message for the ones it does not: a
//! misspelled `ETCD_WARDEN_STOER` would otherwise be ignored silently and the warden would start
//! with the default store. `run` and `standby` refuse to start on one; other commands warn.

use clap::CommandFactory;

use super::Cli;

/// Variables read outside clap's definitions: test failpoints, the restore path switch, the
/// reference generator's switch, and the commit the build stamps (cargo sets it for tests too).
const INTERNAL: &[&str] = &[
    "ETCD_WARDEN_FAILPOINT",
    "ETCD_WARDEN_FAILPOINT_PAUSE",
    crate::restore::execute::REPLAY_THROUGH_ETCD,
    "ETCD_WARDEN_WRITE_REFERENCE",
    "ETCD_WARDEN_COMMIT",
    // Read by the set-up scripts and the test suite, which share the environment with the warden.
    "ETCD_WARDEN_CACHE",
    "ETCD_WARDEN_STATIC_BIN",
    "ETCD_WARDEN_FAULT_SECONDS",
    "ETCD_WARDEN_FAULT_SEED",
    "ETCD_WARDEN_TEST_NETNS",
];

/// Every `ETCD_WARDEN_*` name an option of any command reads, plus the internal ones.
pub fn known() -> Vec<String> {
    fn walk(cmd: &clap::Command, out: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            if let Some(name) = arg.get_env().and_then(|e| e.to_str()) {
                out.push(name.to_owned());
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, out);
        }
    }
    let mut out: Vec<String> = INTERNAL.iter().map(|s| (*s).to_owned()).collect();
    walk(&Cli::command(), &mut out);
    out.sort();
    out.dedup();
    out
}

/// One warning per `ETCD_WARDEN_*` variable in `names` that nothing reads, with the closest real
/// name when one is near enough to be a typo.
pub fn unknown<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let known = known();
    let mut warnings: Vec<String> = names
        .into_iter()
        .filter(|n| n.starts_with("ETCD_WARDEN_") && !known.iter().any(|k| k == n))
        .map(|name| {
            let closest = known
                .iter()
                .map(|k| (strsim::levenshtein(name, k), k))
                .min()
                .filter(|(d, k)| *d <= 3.max(k.len() / 5));
            match closest {
                Some((_, k)) => {
                    format!("environment variable {name} is not one etcd-warden reads; did you mean {k}?")
                }
                None => format!(
                    "environment variable {name} is not one etcd-warden reads (docs/reference.md lists them)"
                ),
            }
        })
        .collect();
    warnings.sort();
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_gets_the_closest_name_and_real_names_pass() {
        let w = unknown([
            "ETCD_WARDEN_STOER",
            "ETCD_WARDEN_STORE",
            "PATH",
            "ETCD_WARDEN_FAILPOINT",
        ]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("ETCD_WARDEN_STOER") && w[0].contains("did you mean ETCD_WARDEN_STORE?"),
            "{w:?}"
        );
        let far = unknown(["ETCD_WARDEN_SOMETHING_ELSE_ENTIRELY"]);
        assert!(far[0].contains("etcd-warden reads (docs/reference.md"), "{far:?}");
    }

    #[test]
    fn the_known_names_cover_every_command() {
        let k = known();
        for name in [
            "ETCD_WARDEN_STORE",
            "ETCD_WARDEN_LISTEN",
            "ETCD_WARDEN_IDENTITY_FILE",
            "ETCD_WARDEN_ADMIN_SOCKET",
        ] {
            assert!(k.iter().any(|n| n == name), "{name} missing from {k:?}");
        }
    }

    /// Every ETCD_WARDEN_* name the repository's scripts and tests use is one the warden knows
    /// (they share its environment: an unknown one would print a warning on every start).
    #[test]
    fn the_names_the_set_up_and_tests_use_are_known() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let known = known();
        let mut unknown = Vec::new();
        for dir in ["scripts", "tests", ".ci"] {
            let mut stack = vec![root.join(dir)];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        stack.push(p);
                        continue;
                    }
                    let text = std::fs::read_to_string(&p).unwrap_or_default();
                    for (i, _) in text.match_indices("ETCD_WARDEN_") {
                        let name: String = text[i..]
                            .chars()
                            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                            .collect();
                        // The typos tests/cli.rs feeds on purpose, and the bare prefix.
                        if name.len() > "ETCD_WARDEN_".len()
                            && !known.contains(&name)
                            && !["ETCD_WARDEN_STOER", "ETCD_WARDEN_STOP_TIMOUT"].contains(&name.as_str())
                        {
                            unknown.push(format!("{name} in {}", p.display()));
                        }
                    }
                }
            }
        }
        unknown.sort();
        unknown.dedup();
        assert!(
            unknown.is_empty(),
            "names the warden would warn about: {unknown:?}"
        );
    }
}
