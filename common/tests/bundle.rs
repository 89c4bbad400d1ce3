//! The bundle contract, end to end: sign → verify round trips, the committed negative
//! fixtures, the every-byte-flip test, size limits, key rotation, and the binding checks.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failure should stop the test loudly"
)]

mod support;

use std::path::{Path, PathBuf};

use exk8s_common::binding::DEFAULT_CLOCK_SKEW_SECS;
use exk8s_common::contract::BundleKind;
use exk8s_common::envelope::{BUNDLE_PAYLOAD_TYPE, Envelope};
use exk8s_common::limits::{MAX_ENVELOPE_BYTES, MAX_FILE_BYTES};
use exk8s_common::names::{BundlePath, FileMode, Nonce};
use exk8s_common::payload::BundleFile;
use exk8s_common::{BundleError, BundleSigner, Disposition, Expected, Keyring, verify};
use support::fixtures::{self, FIXTURE_ISSUED_AT, FIXTURE_NONCE, FIXTURE_VM_ID};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn trusted() -> Keyring {
    let mut ring = Keyring::new();
    ring.insert(fixtures::test_signer().verifying_key());
    ring
}

fn nonce() -> Nonce {
    Nonce::new(FIXTURE_NONCE).unwrap()
}

fn expected(nonce: &Nonce) -> Expected<'_> {
    Expected {
        vm_id: FIXTURE_VM_ID,
        nonce: Some(nonce),
        cluster_id: Some(42),
        org_id: Some(7),
        kind: Some(BundleKind::Bootstrap),
        now: FIXTURE_ISSUED_AT + 60,
        clock_skew_secs: DEFAULT_CLOCK_SKEW_SECS,
        applied_serial: None,
    }
}

/// Verification plus binding, as the agent runs them; the refusal kind or `ok`.
fn judge(envelope: &[u8]) -> String {
    let nonce = nonce();
    match verify(envelope, &trusted()).and_then(|b| b.check_binding(&expected(&nonce))) {
        Ok(_) => "ok".to_owned(),
        Err(e) => e.kind().to_owned(),
    }
}

#[test]
fn a_signed_bundle_round_trips_exactly() {
    let payload = fixtures::valid_payload();
    let envelope = fixtures::test_signer().sign_bundle(&payload).unwrap();
    let verified = verify(&envelope, &trusted()).unwrap();
    assert_eq!(verified.payload(), &payload);
    assert_eq!(verified.key_id(), fixtures::test_signer().key_id());
    let raw: Envelope = serde_json::from_slice(&envelope).unwrap();
    assert_eq!(raw.payload_type, BUNDLE_PAYLOAD_TYPE);
    let nonce = nonce();
    assert_eq!(
        verified.check_binding(&expected(&nonce)).unwrap(),
        Disposition::Apply
    );
}

#[test]
fn a_payload_serialised_in_two_steps_is_the_whole_payload_serialised() {
    let mut payload = fixtures::valid_payload();
    let body = exk8s_common::payload::PayloadBody::of(&payload).unwrap();
    // The head may change after the body is made (the issuer takes the serial last).
    payload.freshness.serial = 98_765;
    payload.identity.generation = 4;
    let finished = body.finish(&payload.identity, &payload.freshness).unwrap();
    assert_eq!(
        String::from_utf8(finished.to_vec()).unwrap(),
        serde_json::to_string(&payload).unwrap()
    );
    assert!(!format!("{body:?}").contains("PRIVATE"), "{body:?}");
}

#[test]
fn every_committed_fixture_is_judged_as_its_folder_says() {
    let mut seen = 0;
    for entry in std::fs::read_dir(data_dir()).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.join("envelope.json").is_file() {
            continue;
        }
        let envelope = std::fs::read(dir.join("envelope.json")).unwrap();
        let expect = std::fs::read_to_string(dir.join("expect")).unwrap();
        let verdict = judge(&envelope);
        println!(
            "fixture {:<26} -> {verdict}",
            dir.file_name().unwrap().to_string_lossy()
        );
        assert_eq!(verdict, expect.trim(), "fixture {}", dir.display());
        seen += 1;
    }
    assert!(
        seen >= 12,
        "expected the committed fixture folders, found {seen}"
    );
}

#[test]
fn committed_fixtures_match_the_generator() {
    let pub_file = data_dir().join("trusted-keys/test-key.pub");
    assert_eq!(
        std::fs::read_to_string(&pub_file).unwrap_or_default(),
        fixtures::test_key_pub_text(),
        "{} drifted; regenerate the fixtures",
        pub_file.display()
    );
    let ring = Keyring::load_dir(&data_dir().join("trusted-keys")).unwrap();
    assert_eq!(
        ring.key_ids().collect::<Vec<_>>(),
        [fixtures::test_signer().key_id()]
    );
    for fixture in fixtures::all() {
        let dir = data_dir().join(fixture.name);
        let committed = std::fs::read(dir.join("envelope.json")).unwrap_or_default();
        assert!(
            committed == fixture.envelope,
            "{} drifted from tests/support/fixtures.rs; regenerate with \
             `cargo run -p exk8s-common --features sign --example make-fixtures`",
            dir.display()
        );
    }
}

#[test]
fn refusals_name_the_attack() {
    let read = |name: &str| std::fs::read(data_dir().join(name).join("envelope.json")).unwrap();
    let err = verify(&read("path-traversal"), &trusted()).unwrap_err();
    let BundleError::MalformedPayload { at, reason } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(at, "files[0].path");
    assert!(reason.contains("`..`"), "{reason}");

    let err = verify(&read("bad-mode"), &trusted()).unwrap_err();
    assert!(err.to_string().contains("files[0].mode"), "{err}");
    assert!(err.to_string().contains("setuid"), "{err}");

    let err = verify(&read("oversized"), &trusted()).unwrap_err();
    assert!(err.to_string().contains("more than 512 entries"), "{err}");

    let err = verify(&read("unknown-field"), &trusted()).unwrap_err();
    assert!(err.to_string().contains("is_admin"), "{err}");
}

/// Flips bits in every byte of a valid envelope, one byte at a time. Every variant must be
/// refused, and refused before the payload is trusted: by decoding, the signature, or the type.
#[test]
fn every_single_byte_change_is_refused() {
    let envelope = std::fs::read(data_dir().join("valid/envelope.json")).unwrap();
    let ring = trusted();
    let mut by_kind = std::collections::BTreeMap::<&str, usize>::new();
    for mask in [0x01u8, 0x20, 0x80] {
        for i in 0..envelope.len() {
            let mut mutated = envelope.clone();
            mutated[i] ^= mask;
            let err = match verify(&mutated, &ring) {
                Ok(_) => panic!("flipping byte {i} with {mask:#04x} still verified"),
                Err(e) => e,
            };
            assert!(
                err.is_pre_signature() || matches!(err, BundleError::WrongPayloadType { .. }),
                "byte {i} ^ {mask:#04x} got past the signature: {err}"
            );
            *by_kind.entry(err.kind()).or_default() += 1;
        }
    }
    println!(
        "{} variants of a {}-byte envelope refused: {by_kind:?}",
        3 * envelope.len(),
        envelope.len()
    );
    assert!(by_kind.contains_key("bad-signature"));
    assert!(by_kind.contains_key("malformed-envelope"));
}

#[test]
fn envelopes_over_the_size_limit_are_refused_unread() {
    let mut huge = br#"{"payloadType":"x","payload":""#.to_vec();
    huge.resize(MAX_ENVELOPE_BYTES as usize + 1, b'A');
    let err = verify(&huge, &trusted()).unwrap_err();
    assert!(matches!(err, BundleError::EnvelopeTooLarge { .. }), "{err}");
}

#[test]
fn a_file_over_one_mebibyte_is_refused_and_one_at_the_limit_passes() {
    let mut payload = fixtures::valid_payload();
    let path = BundlePath::new("/etc/exk8s/big").unwrap();
    payload.files.push(BundleFile::new(
        path.clone(),
        FileMode::PUBLIC,
        vec![b'x'; MAX_FILE_BYTES],
    ));
    let at_limit = fixtures::test_signer().sign_bundle(&payload).unwrap();
    assert!(verify(&at_limit, &trusted()).is_ok());

    payload.files.pop();
    payload.files.push(BundleFile::new(
        path,
        FileMode::PUBLIC,
        vec![b'x'; MAX_FILE_BYTES + 1],
    ));
    let over = fixtures::test_signer().sign_bundle(&payload).unwrap();
    let err = verify(&over, &trusted()).unwrap_err();
    assert!(err.to_string().contains("files[3].content"), "{err}");
    assert!(err.to_string().contains("limit"), "{err}");
}

#[test]
fn rotation_trusts_several_keys_and_dropping_one_revokes_it() {
    let old = fixtures::test_signer();
    let new = BundleSigner::from_seed(&[0x33; 32]);
    let payload = fixtures::valid_payload();
    let by_old = old.sign_bundle(&payload).unwrap();
    let by_new = new.sign_bundle(&payload).unwrap();

    let mut both = Keyring::new();
    both.insert(old.verifying_key());
    both.insert(new.verifying_key());
    assert_eq!(verify(&by_old, &both).unwrap().key_id(), old.key_id());
    assert_eq!(verify(&by_new, &both).unwrap().key_id(), new.key_id());

    let mut only_new = Keyring::new();
    only_new.insert(new.verifying_key());
    assert_eq!(
        verify(&by_old, &only_new).unwrap_err().kind(),
        "unknown-keyid"
    );
}

#[test]
fn the_key_id_is_a_hint_and_the_signature_decides() {
    // An untrusted signature first, then a trusted one: accepted by the trusted one.
    let payload_bytes = serde_json::to_vec(&fixtures::valid_payload()).unwrap();
    let untrusted = BundleSigner::from_seed(&fixtures::UNTRUSTED_KEY_SEED);
    let mut envelope = untrusted.sign(BUNDLE_PAYLOAD_TYPE, &payload_bytes);
    envelope.signatures.extend(
        fixtures::test_signer()
            .sign(BUNDLE_PAYLOAD_TYPE, &payload_bytes)
            .signatures,
    );
    assert!(verify(&serde_json::to_vec(&envelope).unwrap(), &trusted()).is_ok());

    // A trusted key id carrying another key's signature: refused as a bad signature.
    let mut forged = untrusted.sign(BUNDLE_PAYLOAD_TYPE, &payload_bytes);
    forged.signatures[0].keyid = fixtures::test_signer().key_id().to_string();
    let err = verify(&serde_json::to_vec(&forged).unwrap(), &trusted()).unwrap_err();
    assert_eq!(err.kind(), "bad-signature");

    let mut unsigned = forged.clone();
    unsigned.signatures.clear();
    let err = verify(&serde_json::to_vec(&unsigned).unwrap(), &trusted()).unwrap_err();
    assert_eq!(err.kind(), "unsigned");
}

#[test]
fn binding_checks_identity_kind_nonce_freshness_and_rollback() {
    let envelope = std::fs::read(data_dir().join("valid/envelope.json")).unwrap();
    let bundle = verify(&envelope, &trusted()).unwrap();
    let good = nonce();
    let other = Nonce::new("another-nonce-000000000").unwrap();
    let base = expected(&good);
    let kind = |e: Expected<'_>| match bundle.check_binding(&e) {
        Ok(d) => format!("{d:?}"),
        Err(e) => e.kind().to_owned(),
    };
    let expires = FIXTURE_ISSUED_AT + 900;
    let skew = DEFAULT_CLOCK_SKEW_SECS;

    assert_eq!(
        kind(Expected {
            vm_id: 102,
            ..base.clone()
        }),
        "wrong-vm"
    );
    assert_eq!(
        kind(Expected {
            cluster_id: Some(43),
            ..base.clone()
        }),
        "wrong-cluster"
    );
    assert_eq!(
        kind(Expected {
            org_id: Some(8),
            ..base.clone()
        }),
        "wrong-org"
    );
    assert_eq!(
        kind(Expected {
            kind: Some(BundleKind::Update),
            ..base.clone()
        }),
        "wrong-kind"
    );
    assert_eq!(
        kind(Expected {
            kind: None,
            ..base.clone()
        }),
        "Apply"
    );
    assert_eq!(
        kind(Expected {
            nonce: Some(&other),
            ..base.clone()
        }),
        "nonce-mismatch"
    );
    assert_eq!(
        kind(Expected {
            now: expires + skew,
            ..base.clone()
        }),
        "Apply"
    );
    assert_eq!(
        kind(Expected {
            now: expires + skew + 1,
            ..base.clone()
        }),
        "expired"
    );
    assert_eq!(
        kind(Expected {
            now: FIXTURE_ISSUED_AT - skew,
            ..base.clone()
        }),
        "Apply"
    );
    assert_eq!(
        kind(Expected {
            now: FIXTURE_ISSUED_AT - skew - 1,
            ..base.clone()
        }),
        "not-yet-valid"
    );
    assert_eq!(
        kind(Expected {
            applied_serial: Some(4),
            ..base.clone()
        }),
        "rollback"
    );
    assert_eq!(
        kind(Expected {
            applied_serial: Some(3),
            ..base.clone()
        }),
        "AlreadyApplied"
    );
    assert_eq!(
        kind(Expected {
            applied_serial: Some(2),
            ..base.clone()
        }),
        "Apply"
    );
    assert_eq!(
        kind(Expected {
            nonce: None,
            ..base
        }),
        "Apply"
    );
}

#[test]
fn secrets_never_show_in_debug_output() {
    let payload = fixtures::valid_payload();
    let debug = format!("{payload:?}");
    assert!(!debug.contains("PRIVATE KEY"), "{debug}");
    assert!(debug.contains("bytes redacted"));

    let signer = fixtures::test_signer();
    let debug = format!("{signer:?}");
    assert!(debug.contains("[redacted]"));
    let secret = signer.to_secret_text();
    let seed_b64 = secret.split_whitespace().nth(1).unwrap();
    assert!(!debug.contains(seed_b64));
}

#[test]
fn signing_keys_round_trip_through_their_secret_file_text() {
    let signer = BundleSigner::generate().unwrap();
    let again = BundleSigner::from_secret_text(&signer.to_secret_text()).unwrap();
    assert_eq!(again.key_id(), signer.key_id());
    assert!(BundleSigner::from_secret_text("exk8s-ed25519-secret AAAA").is_err());
    assert!(BundleSigner::from_secret_text("").is_err());

    let mut ring = Keyring::new();
    ring.add_pub_text(&signer.pub_line("api 2026"), "api.pub")
        .unwrap();
    let envelope = signer.sign_bundle(&fixtures::valid_payload()).unwrap();
    assert!(verify(&envelope, &ring).is_ok());
}
