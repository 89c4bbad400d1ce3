//! The fuzz checks: one function per parser that takes hostile input. Each must return for every
//! input — an `Err` is fine, a panic, an overflow or a hang is a bug — and each asserts what an
//! accepted value promises.
//!
//! The libFuzzer binaries in `fuzz_targets/` call these (`scripts/fuzz.sh`); `tests/replay.rs`
//! runs every file of `corpus/` and `regressions/` through them on stable in `cargo test`, so an
//! input that once crashed stays a test.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a fuzz check reports a broken invariant by panicking; that is its whole job"
)]

use std::sync::OnceLock;

use exk8s_api::app::ApiConfig;
use exk8s_api::founding::request::{CreateClusterRequest, ValidateCluster as _};
use exk8s_api::http::extract::decode_json;
use exk8s_common::names::{AllowList, ArtifactDest, ArtifactRoots, BundlePath, FileRoots};
use exk8s_common::{BUNDLE_PAYLOAD_TYPE, BundlePayload, BundleSigner, Keyring, verify};

/// Error messages name the problem without echoing unbounded input.
const MAX_ERROR_CHARS: usize = 2048;

/// The fixtures' public TEST key (its seed is in `common/tests/support/fixtures.rs`): the
/// envelope corpus holds envelopes it signed, so the fuzzer starts from valid ones.
const FIXTURE_KEY_PUB: &str = include_str!("../../common/tests/data/trusted-keys/test-key.pub");

/// A key for the payload check only; its seed is public here, nothing signed by it is trusted.
const PAYLOAD_KEY_SEED: [u8; 32] = [0x5a; 32];

fn fixture_keyring() -> &'static Keyring {
    static KEYRING: OnceLock<Keyring> = OnceLock::new();
    KEYRING.get_or_init(|| {
        let mut keyring = Keyring::new();
        keyring
            .add_pub_text(FIXTURE_KEY_PUB, "test-key.pub")
            .expect("the fixture key parses");
        keyring
    })
}

fn payload_signer() -> &'static (BundleSigner, Keyring) {
    static SIGNER: OnceLock<(BundleSigner, Keyring)> = OnceLock::new();
    SIGNER.get_or_init(|| {
        let signer = BundleSigner::from_seed(&PAYLOAD_KEY_SEED);
        let mut keyring = Keyring::new();
        keyring.insert(signer.verifying_key());
        (signer, keyring)
    })
}

fn bounded(what: &str, message: &str) {
    let chars = message.chars().count();
    assert!(
        chars <= MAX_ERROR_CHARS,
        "{what}: an error message of {chars} characters echoes its input"
    );
}

/// Envelope decoding and verification, against the fixtures' trusted key.
pub fn envelope(data: &[u8]) {
    match verify(data, fixture_keyring()) {
        Ok(verified) => {
            // Verification is a pure function of the bytes.
            let again = verify(data, fixture_keyring()).expect("verified once, verifies again");
            assert_eq!(verified.payload_sha256(), again.payload_sha256());
            assert_eq!(verified.payload(), again.payload());
        }
        Err(e) => bounded("envelope", &e.to_string()),
    }
}

/// Payload parsing past a valid signature: the input is signed with a test key, so every byte
/// reaches the payload parser (a fuzzer cannot forge ed25519).
pub fn payload(data: &[u8]) {
    let (signer, keyring) = payload_signer();
    let envelope = serde_json::to_vec(&signer.sign(BUNDLE_PAYLOAD_TYPE, data)).unwrap();
    match verify(&envelope, keyring) {
        Ok(verified) => {
            // What was accepted serialises, and the serialised form means the same bundle.
            let payload: &BundlePayload = verified.payload();
            let resigned = signer
                .sign_bundle(payload)
                .expect("an accepted payload serialises");
            let reparsed = verify(&resigned, keyring).expect("a re-serialised payload verifies");
            assert_eq!(reparsed.payload(), payload);
        }
        Err(e) => bounded("payload", &e.to_string()),
    }
}

/// `BundlePath` and `ArtifactDest` validation, on the input as UTF-8 text.
pub fn bundle_path(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    allowed::<FileRoots>(text, BundlePath::new(text).map(|p| p.as_str().to_owned()));
    allowed::<ArtifactRoots>(text, ArtifactDest::new(text).map(|p| p.as_str().to_owned()));
}

fn allowed<L: AllowList>(input: &str, parsed: Result<String, exk8s_common::names::PathError>) {
    match parsed {
        Ok(path) => {
            assert_eq!(path, input, "a path is accepted as given, never rewritten");
            assert!(!path.contains('\0'), "NUL accepted in {path:?}");
            assert!(path.len() <= 4096, "a path longer than PATH_MAX accepted");
            let mut parts = path.split('/');
            assert_eq!(parts.next(), Some(""), "a relative path accepted: {path:?}");
            for part in parts {
                assert!(
                    !part.is_empty() && part != "." && part != "..",
                    "{path:?} has an empty, `.` or `..` component"
                );
                assert!(
                    part.len() <= 255,
                    "a component longer than NAME_MAX accepted"
                );
            }
            assert!(
                L::ROOTS.iter().any(|root| path
                    .strip_prefix(root)
                    .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1)),
                "{path:?} is not strictly inside an allowed root"
            );
        }
        Err(e) => bounded("path", &e.to_string()),
    }
}

/// The `POST /clusters` body parser: JSON decoding as the handler does it, then validation.
pub fn create_cluster_body(data: &[u8]) {
    static VERSIONS: OnceLock<Vec<String>> = OnceLock::new();
    let versions = VERSIONS.get_or_init(|| ApiConfig::default().kubernetes_versions);
    let Ok(request) = decode_json::<CreateClusterRequest>(data) else {
        return;
    };
    assert_eq!(
        data.iter().find(|b| !b.is_ascii_whitespace()),
        Some(&b'{'),
        "a body that is not a JSON object was accepted"
    );
    if let Ok(spec) = request.validate(versions) {
        assert!(
            spec.control_plane_count == 1 || spec.control_plane_count == 3,
            "control_plane_count {} accepted",
            spec.control_plane_count
        );
        assert!(spec.control_plane_image_id > 0);
        assert!(spec.subnet_id > 0);
        assert!((10..=2048).contains(&spec.root_volume_size_gib));
        assert!(versions.contains(&spec.kubernetes_version));
        assert!(!spec.control_plane_instance_type.is_empty());
    }
}
