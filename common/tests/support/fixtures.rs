//! Builds every fixture envelope under `common/tests/data/` from code, deterministically
//! (ed25519 signatures are deterministic), so the committed files can be checked for drift and
//! regenerated with `cargo run -p exk8s-common --features sign --example make-fixtures`.
//!
//! THE KEYS HERE ARE TEST KEYS. Their seeds are public; nothing signed by them is ever trusted
//! outside this repository's tests.

#![allow(
    unreachable_pub,
    dead_code,
    reason = "shared by the fixture example and the tests, each using a part"
)]

use exk8s_common::BundleSigner;
use exk8s_common::envelope::BUNDLE_PAYLOAD_TYPE;
use exk8s_common::limits::MAX_FILES;
use exk8s_common::names::{BundlePath, FileMode, Nonce, Sha256Digest};
use exk8s_common::payload::{
    Artifact, BundleFile, BundlePayload, Freshness, Identity, Package, PlanStep, Role,
};

/// Seed of the test-only trusted signing key.
pub const TEST_KEY_SEED: [u8; 32] = [0x11; 32];
/// Seed of a key nobody trusts.
pub const UNTRUSTED_KEY_SEED: [u8; 32] = [0x22; 32];
/// Nonce every fixture echoes.
pub const FIXTURE_NONCE: &str = "fixture-nonce-0123456789";
/// The VM every fixture is for.
pub const FIXTURE_VM_ID: u64 = 101;
/// issued_at of every fixture (2026-01-01T00:00:00Z); expires 15 minutes later.
pub const FIXTURE_ISSUED_AT: i64 = 1_767_225_600;

pub fn test_signer() -> BundleSigner {
    BundleSigner::from_seed(&TEST_KEY_SEED)
}

/// `trusted-keys/test-key.pub`: the test key as an agent trusts it.
pub fn test_key_pub_text() -> String {
    format!(
        "# TEST KEY ONLY: its seed is public in common/tests/support/fixtures.rs.\n{}\n",
        test_signer().pub_line("exk8s test fixtures")
    )
}

fn path(p: &str) -> BundlePath {
    BundlePath::new(p).unwrap()
}

fn parse<T: std::str::FromStr>(s: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    s.parse().unwrap()
}

/// A small, complete, valid payload.
pub fn valid_payload() -> BundlePayload {
    let kubeconfig = path("/etc/exk8s/kubeconfig/admin.kubeconfig");
    BundlePayload {
        identity: Identity {
            bundle_id: parse("6f1c1a52-3c7e-4d4e-9a55-0b0f6d1e2a01"),
            cluster_id: 42,
            cluster_name: parse("exk8s-7-2a"),
            org_id: 7,
            vm_id: FIXTURE_VM_ID,
            node_name: parse("cp-1.cluster-42.internal"),
            role: Role::ControlPlane,
            is_initial_control_plane: true,
            kind: exk8s_common::contract::BundleKind::Bootstrap,
            generation: 1,
        },
        freshness: Freshness {
            issued_at: FIXTURE_ISSUED_AT,
            expires_at: FIXTURE_ISSUED_AT + 900,
            serial: 3,
            nonce: Nonce::new(FIXTURE_NONCE).unwrap(),
        },
        files: vec![
            BundleFile::new(
                path("/etc/exk8s/config/cluster.env"),
                FileMode::PUBLIC,
                "CLUSTER_NAME=exk8s-7-2a\nNODE_NAME=cp-1.cluster-42.internal\n",
            ),
            BundleFile::new(
                path("/etc/exk8s/pki/etcd-server-key.pem"),
                FileMode::SECRET,
                "-----BEGIN PRIVATE KEY-----\nnot a real key, a fixture\n-----END PRIVATE KEY-----\n",
            ),
            BundleFile::new(
                path("/etc/systemd/system/etcd.service"),
                FileMode::PUBLIC,
                "[Unit]\nDescription=etcd\n",
            ),
        ],
        artifacts: vec![Artifact {
            name: parse("etcd"),
            version: parse("v3.6.10"),
            url: parse("https://artifacts.example.invalid/etcd-v3.6.10"),
            sha256: Some(Sha256Digest::of(b"etcd binary")),
            archive_member: Some(parse("etcd-v3.6.10-linux-amd64/etcd")),
            dest: parse("/usr/local/bin/etcd"),
            mode: FileMode::EXECUTABLE,
        }],
        packages: vec![Package {
            name: parse("containerd"),
        }],
        plan: vec![
            PlanStep::DaemonReload {},
            PlanStep::EnableStart {
                unit: parse("etcd.service"),
                watch: vec![path("/etc/systemd/system/etcd.service")],
            },
            PlanStep::WaitApiserverReady {
                kubeconfig,
                timeout_secs: 600,
            },
        ],
    }
}

fn signed(payload: &BundlePayload) -> Vec<u8> {
    test_signer().sign_bundle(payload).unwrap()
}

/// Signs arbitrary payload JSON (for payloads the typed model cannot even represent).
fn signed_json(value: &serde_json::Value) -> Vec<u8> {
    let bytes = serde_json::to_vec(value).unwrap();
    serde_json::to_vec(&test_signer().sign(BUNDLE_PAYLOAD_TYPE, &bytes)).unwrap()
}

/// A fixture: folder name, envelope bytes, the refusal kind expected (`None` = must verify).
pub struct Fixture {
    pub name: &'static str,
    pub envelope: Vec<u8>,
    pub expect: Option<&'static str>,
    pub about: &'static str,
}

pub fn all() -> Vec<Fixture> {
    let valid = valid_payload();
    let valid_env = signed(&valid);
    let valid_json = serde_json::to_value(&valid).unwrap();

    let bad_signature = {
        let mut env: serde_json::Value = serde_json::from_slice(&valid_env).unwrap();
        let sig = env["signatures"][0]["sig"].as_str().unwrap().to_owned();
        // Replace the first base64 character: still valid base64, still 64 bytes, wrong signature.
        let replaced = if sig.starts_with('A') { "B" } else { "A" };
        env["signatures"][0]["sig"] = format!("{replaced}{}", &sig[1..]).into();
        serde_json::to_vec(&env).unwrap()
    };
    let unknown_keyid = BundleSigner::from_seed(&UNTRUSTED_KEY_SEED)
        .sign_bundle(&valid)
        .unwrap();
    let wrong_payload_type = {
        let bytes = serde_json::to_vec(&valid).unwrap();
        serde_json::to_vec(&test_signer().sign("application/json", &bytes)).unwrap()
    };
    let truncated = valid_env[..valid_env.len() / 2].to_vec();
    let with_file = |path: &str, mode: &str| {
        let mut json = valid_json.clone();
        json["files"][0]["path"] = path.into();
        json["files"][0]["mode"] = mode.into();
        signed_json(&json)
    };
    let too_many_files = {
        let mut payload = valid.clone();
        payload.files = (0..=MAX_FILES)
            .map(|i| BundleFile::new(path(&format!("/etc/exk8s/f/{i}")), FileMode::PUBLIC, "x"))
            .collect();
        signed(&payload)
    };
    let duplicate_path = {
        let mut payload = valid.clone();
        payload.files.push(payload.files[0].clone());
        signed(&payload)
    };
    let digest_mismatch = {
        let mut json = valid_json.clone();
        json["files"][0]["sha256"] = Sha256Digest::of(b"something else").to_hex().into();
        signed_json(&json)
    };
    let unknown_field = {
        let mut json = valid_json.clone();
        json["identity"]["is_admin"] = true.into();
        signed_json(&json)
    };
    let other_vm = {
        let mut payload = valid.clone();
        payload.identity.vm_id = FIXTURE_VM_ID + 1;
        signed(&payload)
    };
    let zero_generation = {
        let mut payload = valid.clone();
        payload.identity.generation = 0;
        signed(&payload)
    };
    let plan_file_missing = {
        let mut payload = valid.clone();
        payload.plan.push(PlanStep::InstallStaticPod {
            manifest: "/etc/kubernetes/manifests/not-in-the-bundle.yaml"
                .parse()
                .unwrap(),
        });
        signed(&payload)
    };
    let update_kind = {
        let mut payload = valid.clone();
        payload.identity.kind = exk8s_common::contract::BundleKind::Update;
        signed(&payload)
    };

    vec![
        Fixture {
            name: "valid",
            envelope: valid_env,
            expect: None,
            about: "a complete bundle signed by the test key",
        },
        Fixture {
            name: "zero-generation",
            envelope: zero_generation,
            expect: Some("zero-generation"),
            about: "a signed bundle carrying generation 0 (generations start at 1)",
        },
        Fixture {
            name: "plan-file-missing",
            envelope: plan_file_missing,
            expect: Some("plan-file-missing"),
            about: "a plan that installs a static pod manifest the bundle does not carry",
        },
        Fixture {
            name: "update-for-bootstrap",
            envelope: update_kind,
            expect: Some("wrong-kind"),
            about: "a signed update bundle offered where the first (bootstrap) bundle was asked for",
        },
        Fixture {
            name: "bad-signature",
            envelope: bad_signature,
            expect: Some("bad-signature"),
            about: "the valid envelope with one character of the signature changed",
        },
        Fixture {
            name: "unknown-keyid",
            envelope: unknown_keyid,
            expect: Some("unknown-keyid"),
            about: "a valid bundle signed by a key nobody trusts",
        },
        Fixture {
            name: "wrong-payload-type",
            envelope: wrong_payload_type,
            expect: Some("wrong-payload-type"),
            about: "a correctly signed envelope whose payloadType is application/json",
        },
        Fixture {
            name: "truncated",
            envelope: truncated,
            expect: Some("malformed-envelope"),
            about: "the first half of the valid envelope",
        },
        Fixture {
            name: "path-traversal",
            envelope: with_file("/etc/exk8s/../shadow", "0644"),
            expect: Some("malformed-payload"),
            about: "a signed bundle writing /etc/exk8s/../shadow",
        },
        Fixture {
            name: "path-outside-allow-list",
            envelope: with_file("/root/.ssh/authorized_keys", "0600"),
            expect: Some("malformed-payload"),
            about: "a signed bundle writing outside the allow-list",
        },
        Fixture {
            name: "oversized",
            envelope: too_many_files,
            expect: Some("malformed-payload"),
            about: "a signed bundle with one file more than the 512-file limit (byte-size limits \
                    are exercised by generated envelopes in tests/bundle.rs)",
        },
        Fixture {
            name: "duplicate-path",
            envelope: duplicate_path,
            expect: Some("duplicate-path"),
            about: "a signed bundle naming the same path twice",
        },
        Fixture {
            name: "bad-mode",
            envelope: with_file("/etc/exk8s/config/cluster.env", "4755"),
            expect: Some("malformed-payload"),
            about: "a signed bundle asking for a setuid mode",
        },
        Fixture {
            name: "digest-mismatch",
            envelope: digest_mismatch,
            expect: Some("digest-mismatch"),
            about: "a signed bundle whose file sha256 does not match its content",
        },
        Fixture {
            name: "unknown-field",
            envelope: unknown_field,
            expect: Some("malformed-payload"),
            about: "a signed bundle with a field v1 does not define",
        },
        Fixture {
            name: "other-vm",
            envelope: other_vm,
            expect: Some("wrong-vm"),
            about: "a valid bundle for vm 102, presented to vm 101 (binding check)",
        },
    ]
}
