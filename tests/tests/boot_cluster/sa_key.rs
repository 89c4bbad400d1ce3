//! Rotating the service-account signing key on a booted node: `exk8s rotate-sa-key CLUSTER
//! --drop-old-after 0`, the node's sync unit started once per phase (each restarts the
//! kubelet's apiserver and controller-manager pods from the files it brought):
//!
//! - trust-both: the apiserver publishes two keys (`/openid/v1/jwks`); tokens are still signed
//!   by the old key; the old token authenticates.
//! - sign-new: a new token is signed by the new key (another `kid`); both authenticate.
//! - drop-old: the apiserver publishes the new key alone; the token minted before the rotation
//!   is refused, the one minted after authenticates.
//!
//! (The API's own part — each phase's files, a rotation carried on by another API process, on
//! SQLite and PostgreSQL — is `api/tests/it/sa_rotation.rs`.)

use base64::Engine as _;
use serde_json::Value;

use super::control_plane::admin;
use super::one_node::OneNode;

const SERVICE_ACCOUNT: &str = "system:serviceaccount:default:robot";

/// The `kid` a token's JWT header names.
fn kid(token: &str) -> String {
    let header = token.split('.').next().unwrap();
    let header = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header)
        .unwrap();
    let header: Value = serde_json::from_slice(&header).unwrap();
    header["kid"].as_str().unwrap().to_owned()
}

/// The key ids the apiserver publishes (`/openid/v1/jwks`).
fn published(node: &OneNode<'_>) -> Vec<String> {
    let jwks: Value =
        serde_json::from_str(&admin(&node.machine, &["get", "--raw", "/openid/v1/jwks"])).unwrap();
    jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kid"].as_str().unwrap().to_owned())
        .collect()
}

/// The public keys in the apiserver's `--service-account-key-file`.
fn key_file_keys(node: &OneNode<'_>) -> usize {
    std::fs::read_to_string(node.machine.root.join("etc/exk8s/pki/service-account.pem"))
        .unwrap()
        .matches("-----BEGIN PUBLIC KEY-----")
        .count()
}

/// A fresh token of the `robot` service account.
fn token(node: &OneNode<'_>) -> String {
    admin(
        &node.machine,
        &["create", "token", "robot", "--duration=2h"],
    )
}

/// The module doc's rotation; `before` is a token of `robot` minted before it. A token minted
/// after it, under the new key.
pub(crate) fn rotate(node: &OneNode<'_>, before: &str) -> String {
    let old_kid = kid(before);
    assert_eq!(node.whoami(before).as_deref(), Ok(SERVICE_ACCOUNT));
    assert_eq!(published(node), vec![old_kid.clone()]);
    let name = node.cluster.to_string();
    let phase = || {
        node.exk8s(&["sa-key", &name])["rotation"]["phase"]
            .as_str()
            .map(str::to_owned)
    };
    // The first boot wrote unit files and reloaded systemd: the count below can be seen to move.
    let reloads = node.machine.systemd_reloads();
    assert!(
        reloads > 0,
        "the journal shows no reload of systemd since boot"
    );
    let started = node.exk8s(&["rotate-sa-key", &name, "--drop-old-after", "0"]);
    assert_eq!(started["phase"], "trust-both", "{started}");

    // trust-both: the apiserver restarted with both public keys; the old key still signs.
    node.sync();
    assert_eq!(key_file_keys(node), 2);
    let both = published(node);
    assert_eq!(both.len(), 2, "{both:?}");
    assert!(both.contains(&old_kid));
    let new_kid = both.iter().find(|k| **k != old_kid).unwrap().clone();
    assert_eq!(kid(&token(node)), old_kid, "the old key still signs");
    assert_eq!(node.whoami(before).as_deref(), Ok(SERVICE_ACCOUNT));
    assert_eq!(phase().as_deref(), Some("sign-new"));

    // sign-new: the new key signs; tokens of both keys authenticate.
    node.sync();
    assert_eq!(key_file_keys(node), 2);
    let after = token(node);
    assert_eq!(kid(&after), new_kid, "the new key signs");
    assert_eq!(node.whoami(before).as_deref(), Ok(SERVICE_ACCOUNT));
    assert_eq!(node.whoami(&after).as_deref(), Ok(SERVICE_ACCOUNT));
    // Every apiserver signs with the new key and no wait was asked for: the old key goes.
    assert_eq!(phase().as_deref(), Some("drop-old"));

    // drop-old: the new key alone; the token of the old one is refused.
    node.sync();
    assert_eq!(key_file_keys(node), 1);
    assert_eq!(published(node), vec![new_kid]);
    let refused = node.whoami(before).unwrap_err();
    assert!(refused.contains("Unauthorized"), "{refused}");
    assert_eq!(node.whoami(&after).as_deref(), Ok(SERVICE_ACCOUNT));
    let key = node.exk8s(&["sa-key", &name]);
    assert!(key.get("rotation").is_none(), "the rotation ended: {key}");
    assert_eq!(key["age_days"], 0, "{key}");
    // Three generations applied, none with a unit file of its own: systemd was never reloaded
    // (the agent enables each unit of the plan with `--no-reload`).
    assert_eq!(
        node.machine.systemd_reloads(),
        reloads,
        "syncs that changed no unit file reloaded systemd"
    );
    after
}
