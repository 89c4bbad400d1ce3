//! Replays the seed corpus and every saved crash through the fuzz checks on stable, so
//! `cargo test` keeps each input that once broke a parser as a regression test.

#![allow(clippy::unwrap_used, reason = "test code")]

use std::path::Path;

type Check = fn(&[u8]);

const TARGETS: &[(&str, Check)] = &[
    ("envelope", exk8s_fuzz::envelope),
    ("payload", exk8s_fuzz::payload),
    ("bundle_path", exk8s_fuzz::bundle_path),
    ("create_cluster_body", exk8s_fuzz::create_cluster_body),
];

/// Runs every file of `dir` through `check`; returns how many inputs ran.
fn replay(dir: &Path, check: Check) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut ran = 0;
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if name.starts_with('.') {
            continue;
        }
        let data = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(outcome.is_ok(), "{} breaks its fuzz check", path.display());
        ran += 1;
    }
    ran
}

#[test]
fn every_seed_and_every_saved_crash_passes_its_check() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (target, check) in TARGETS {
        let seeds = replay(&root.join("corpus").join(target), *check);
        assert!(seeds >= 5, "corpus/{target} holds only {seeds} seeds");
        replay(&root.join("regressions").join(target), *check);
    }
}

#[test]
fn the_checks_catch_what_they_promise_to() {
    // A check that cannot fail would prove nothing: a path the allow-list must refuse stays
    // refused, and the valid fixture envelope passes the full verification path.
    assert!(exk8s_common::names::BundlePath::new("/etc/kubernetes/../shadow").is_err());
    let valid =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/envelope/valid.json"))
            .unwrap();
    let mut keyring = exk8s_common::Keyring::new();
    keyring
        .add_pub_text(
            include_str!("../../common/tests/data/trusted-keys/test-key.pub"),
            "test-key.pub",
        )
        .unwrap();
    assert!(exk8s_common::verify(&valid, &keyring).is_ok());
}
