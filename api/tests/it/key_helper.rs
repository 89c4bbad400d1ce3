//! The server's key helper (`exk8s-api keygen`, driven by `KeyMaker::Helper` for RSA-3072 and
//! RSA-4096 keys): its keys are
//! what they claim (read back by openssl, signed into a leaf openssl verifies), an abandoned
//! key's helper is killed and reaped before `make` returns, a helper that cannot start falls
//! back to this process, and one that fails names why.

use std::cell::Cell;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use exk8s_api::pki::{CaRole, CertAuthority, KeyAlgorithm, KeyMaker, LeafSpec, PkiError, Usage};

use crate::helpers::{openssl, openssl_verify};

const BIN: &str = env!("CARGO_BIN_EXE_exk8s-api");

fn helper() -> KeyMaker {
    KeyMaker::Helper(PathBuf::from(BIN))
}

/// The pids of the children this thread started that are still in the process table.
fn children() -> Vec<u32> {
    std::fs::read_to_string("/proc/thread-self/children")
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

#[test]
fn the_keygen_command_writes_a_key_openssl_reads_for_every_algorithm() {
    let dir = tempfile::tempdir().unwrap();
    for (algorithm, expect) in [
        ("rsa-2048", "Private-Key: (2048 bit"),
        ("rsa-3072", "Private-Key: (3072 bit"),
        ("ecdsa-p256", "NIST CURVE: P-256"),
    ] {
        let out = Command::new(BIN)
            .args(["keygen", algorithm])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{algorithm}: {out:?}");
        std::fs::write(dir.path().join("key.der"), &out.stdout).unwrap();
        let (ok, text) = openssl(
            &[
                "pkey", "-inform", "DER", "-in", "key.der", "-noout", "-text",
            ],
            dir.path(),
        );
        assert!(ok && text.contains(expect), "{algorithm}: {text}");
    }
    let out = Command::new(BIN)
        .args(["keygen", "rsa-1024"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && out.stdout.is_empty(), "{out:?}");
    assert!(said.contains("unknown key algorithm `rsa-1024`"), "{said}");
}

#[test]
fn a_helper_made_key_signs_a_leaf_openssl_verifies() {
    let now = time::OffsetDateTime::now_utc();
    let ca = CertAuthority::generate(CaRole::Cluster, KeyAlgorithm::Rsa3072, now).unwrap();
    let key = helper().make(KeyAlgorithm::Rsa3072, &|| false).unwrap();
    assert_eq!(key.algorithm(), KeyAlgorithm::Rsa3072);
    assert!(children().is_empty(), "the helper was reaped");
    let spec = LeafSpec {
        common_name: "system:kube-proxy".into(),
        organization: None,
        usage: Usage::Client,
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
    };
    let leaf = ca.issue_keyed(&spec, now, key).unwrap();
    let (ok, text) = openssl_verify(ca.cert_pem().as_bytes(), leaf.cert_pem.as_bytes(), None);
    assert!(ok, "{text}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("key.pem"), leaf.key_pem.expose()).unwrap();
    std::fs::write(dir.path().join("leaf.pem"), &leaf.cert_pem).unwrap();
    let (_, key_modulus) = openssl(&["rsa", "-in", "key.pem", "-noout", "-modulus"], dir.path());
    let (_, cert_modulus) = openssl(
        &["x509", "-in", "leaf.pem", "-noout", "-modulus"],
        dir.path(),
    );
    assert!(key_modulus.starts_with("Modulus="), "{key_modulus}");
    assert_eq!(
        key_modulus, cert_modulus,
        "the leaf certifies the helper's key"
    );
}

#[test]
fn an_abandoned_key_s_helper_is_killed_and_reaped_midway() {
    // Stop once the helper is running `keygen` (an RSA-4096 key takes far longer than that).
    let seen = Cell::new(None);
    let stop = || {
        let running = children().into_iter().find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == b"rsa-4096"))
        });
        if let Some(pid) = running {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            let state = stat.rsplit(") ").next().unwrap().chars().next().unwrap();
            assert_ne!(state, 'Z', "the helper had not finished yet: {stat}");
            seen.set(Some(pid));
        }
        running.is_some()
    };
    let made = helper().make(KeyAlgorithm::Rsa4096, &stop);
    assert!(matches!(made, Err(PkiError::Stopped)), "{made:?}");
    let pid = seen.get().expect("the helper was seen running");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "helper {pid} is gone"
    );
    assert!(children().is_empty());
}

#[test]
fn a_helper_is_killed_when_abandoned_and_inherits_no_environment() {
    // A helper that never finishes by itself: `make` can only return by killing it. Before it
    // sleeps it records the environment it was given.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("helper");
    std::fs::write(
        &script,
        "#!/bin/sh\n/usr/bin/env > \"$0.env.tmp\" && /bin/mv \"$0.env.tmp\" \"$0.env\"\nexec /bin/sleep 3600\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let recorded = dir.path().join("helper.env");
    let seen = Cell::new(None);
    let stop = || {
        seen.set(children().first().copied());
        recorded.exists()
    };
    let made = KeyMaker::Helper(script).make(KeyAlgorithm::Rsa3072, &stop);
    assert!(matches!(made, Err(PkiError::Stopped)), "{made:?}");
    let pid = seen.get().expect("the helper was seen running");
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert!(children().is_empty());
    let env = std::fs::read_to_string(&recorded).unwrap();
    assert!(
        std::env::var_os("CARGO").is_some(),
        "this test runs under cargo"
    );
    assert!(
        env.lines().all(|l| l.starts_with("PWD=")),
        "the helper got only what sh sets itself: {env}"
    );
}

#[test]
fn a_helper_that_cannot_start_gives_way_and_one_that_fails_names_why() {
    let missing = KeyMaker::Helper(PathBuf::from("/nonexistent/exk8s-api"));
    let key = missing.make(KeyAlgorithm::Rsa3072, &|| false).unwrap();
    assert_eq!(key.algorithm(), KeyAlgorithm::Rsa3072);

    let failing = KeyMaker::Helper(PathBuf::from("/bin/false"));
    let err = failing.make(KeyAlgorithm::Rsa4096, &|| false).unwrap_err();
    let said = err.to_string();
    assert!(
        matches!(err, PkiError::KeyHelper { .. })
            && said.contains("rsa-4096")
            && said.contains("exit status: 1"),
        "{said}"
    );
    // A helper whose output is not a key of the size asked for is refused, not used.
    let liar = KeyMaker::Helper(PathBuf::from("/bin/echo"));
    let said = liar
        .make(KeyAlgorithm::Rsa3072, &|| false)
        .unwrap_err()
        .to_string();
    assert!(said.contains("does not load"), "{said}");
    // Quick keys never go to a helper: ECDSA, and RSA-2048 (its ~40 ms is less than a helper's
    // start-up would add).
    for quick in [KeyAlgorithm::EcdsaP256, KeyAlgorithm::Rsa2048] {
        let key = failing.make(quick, &|| false).unwrap();
        assert_eq!(key.algorithm(), quick);
    }
}
