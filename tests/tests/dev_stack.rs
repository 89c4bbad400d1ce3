//! The dev stack with the real binaries: a restarted stack continues where it stopped (its
//! simulators keep their state in the data dir), and `--artifact-catalog` pins where nodes
//! download their binaries — a configured digest reaches the bundle, and the agent installs a
//! download that matches it and refuses one that does not.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

use base64::Engine as _;
use exk8s_common::names::Sha256Digest;
use exk8s_tests::dev::start_dev;
use exk8s_tests::procs::binary;
use serde_json::Value;

#[test]
fn a_restarted_dev_stack_continues_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("dev");
    let log = dir.path().join("api.log");
    let stack = start_dev(&data, "127.0.13.0/24", &log, &[]);
    let (status, first) = stack.found(1);
    assert_eq!(status, 201, "{first}");
    let first_vm = first["control_plane_vm_ids"][0].as_i64().unwrap();
    drop(stack);

    let stack = start_dev(&data, "127.0.13.0/24", &log, &[]);
    let (status, second) = stack.found(1);
    assert_eq!(status, 201, "founding after a restart: {second}");
    let second_vm = second["control_plane_vm_ids"][0].as_i64().unwrap();
    assert!(second_vm > first_vm, "VM id {second_vm} handed out again");
    // The VM made before the restart still has its instance metadata, so it can bootstrap.
    let envelope = stack.fetch_bundle(first_vm, "restart-test-nonce-0001");
    let envelope: Value = serde_json::from_slice(&envelope).unwrap();
    assert_eq!(envelope["payloadType"], exk8s_common::BUNDLE_PAYLOAD_TYPE);
    let clusters: Value = exk8s_tests::dev::http()
        .get(&format!("{}/clusters", stack.base))
        .set("Authorization", &format!("Bearer {}", stack.token))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    let phases: Vec<&str> = clusters
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["phase"].as_str().unwrap())
        .collect();
    assert_eq!(phases, ["founded", "founded"]);
}

fn tarball(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    for (path, content) in members {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o755);
        header.set_cksum();
        builder.append_data(&mut header, path, *content).unwrap();
    }
    builder.into_inner().unwrap().finish().unwrap()
}

/// Serves `files` (path → body) over plain HTTP on loopback, one request per connection.
fn serve(files: Vec<(String, Vec<u8>)>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = String::new();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            if reader.read_line(&mut request).is_err() {
                continue;
            }
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let path = request.split(' ').nth(1).unwrap_or_default();
            let reply = match files.iter().find(|(p, _)| p == path) {
                Some((_, body)) => {
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    [head.into_bytes(), body.clone()].concat()
                }
                None => b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    .to_vec(),
            };
            let _ = stream.write_all(&reply);
        }
    });
    base
}

/// A catalog pinning every artifact of a v1.35.3 initial node to `base` (etcdutl through
/// etcd's entry: it comes out of the same tarball); `etcd_digest` overrides etcd's.
fn catalog(base: &str, digests: &[(&str, Sha256Digest)], etcd_digest: Option<&str>) -> String {
    let entry = |name: &str, version: &str, path: &str| {
        let digest = digests.iter().find(|(p, _)| *p == path).unwrap().1.to_hex();
        let digest = match (name, etcd_digest) {
            ("etcd", Some(wrong)) => wrong.to_owned(),
            _ => digest,
        };
        format!(
            "[[artifact]]\nname = \"{name}\"\nversion = \"{version}\"\nurl = \"{base}{path}\"\nsha256 = \"{digest}\"\n\n"
        )
    };
    [
        entry("etcd", "v3.6.10", "/etcd.tar.gz"),
        entry("etcdctl", "v3.6.10", "/etcd.tar.gz"),
        entry("kubelet", "v1.35.3", "/kubelet"),
        entry("kubectl", "v1.35.3", "/kubectl"),
        entry("helm", "v3.19.2", "/helm.tar.gz"),
    ]
    .concat()
}

fn prereqs(keys: &Path, bundle: &Path, root: &Path) -> std::process::Output {
    Command::new(binary("exk8s-agent"))
        .env("EXK8S_CONFIG", root.with_extension("no-config.toml"))
        .arg("--keys-dir")
        .arg(keys)
        .args(["prereqs", "--bundle"])
        .arg(bundle)
        .arg("--root")
        .arg(root)
        .output()
        .unwrap()
}

#[test]
fn a_pinned_artifact_digest_reaches_the_bundle_and_decides_the_download() {
    let etcd = tarball(&[
        ("etcd-v3.6.10-linux-amd64/etcd", b"#!/bin/sh\necho etcd\n"),
        (
            "etcd-v3.6.10-linux-amd64/etcdctl",
            b"#!/bin/sh\necho etcdctl\n",
        ),
        (
            "etcd-v3.6.10-linux-amd64/etcdutl",
            b"#!/bin/sh\necho etcdutl\n",
        ),
    ]);
    let helm = tarball(&[("linux-amd64/helm", b"#!/bin/sh\necho helm\n")]);
    let files: Vec<(String, Vec<u8>)> = vec![
        ("/etcd.tar.gz".into(), etcd),
        ("/kubelet".into(), b"#!/bin/sh\necho kubelet\n".to_vec()),
        ("/kubectl".into(), b"#!/bin/sh\necho kubectl\n".to_vec()),
        ("/helm.tar.gz".into(), helm),
    ];
    let digests: Vec<(&str, Sha256Digest)> = vec![
        ("/etcd.tar.gz", Sha256Digest::of(&files[0].1)),
        ("/kubelet", Sha256Digest::of(&files[1].1)),
        ("/kubectl", Sha256Digest::of(&files[2].1)),
        ("/helm.tar.gz", Sha256Digest::of(&files[3].1)),
    ];
    let base = serve(files);
    let wrong = "0".repeat(64);
    for (label, etcd_digest) in [("right", None), ("wrong", Some(wrong.as_str()))] {
        let dir = tempfile::tempdir().unwrap();
        let catalog_path = dir.path().join("artifacts.toml");
        std::fs::write(&catalog_path, catalog(&base, &digests, etcd_digest)).unwrap();
        let data = dir.path().join("dev");
        let stack = start_dev(
            &data,
            "127.0.14.0/24",
            &dir.path().join("api.log"),
            &["--artifact-catalog", catalog_path.to_str().unwrap()],
        );
        let (status, created) = stack.found(1);
        assert_eq!(status, 201, "{created}");
        let vm = created["control_plane_vm_ids"][0].as_i64().unwrap();
        let envelope = stack.fetch_bundle(vm, "catalog-test-nonce-0001");
        let payload: Value = {
            let outer: Value = serde_json::from_slice(&envelope).unwrap();
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(outer["payload"].as_str().unwrap())
                .unwrap();
            serde_json::from_slice(&bytes).unwrap()
        };
        let etcd_artifact = payload["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == "etcd")
            .unwrap()
            .clone();
        assert_eq!(
            etcd_artifact["url"],
            format!("{base}/etcd.tar.gz"),
            "{label}"
        );
        let expected = etcd_digest.map_or_else(|| digests[0].1.to_hex(), str::to_owned);
        assert_eq!(etcd_artifact["sha256"], expected, "{label}");
        // etcdutl, which the catalog does not name, comes from etcd's pinned tarball.
        let etcdutl = payload["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == "etcdutl")
            .unwrap()
            .clone();
        assert_eq!(
            (&etcdutl["url"], &etcdutl["sha256"]),
            (&etcd_artifact["url"], &etcd_artifact["sha256"]),
            "{label}"
        );

        let bundle = dir.path().join("bundle.json");
        std::fs::write(&bundle, &envelope).unwrap();
        let root = dir.path().join("image");
        let out = prereqs(&data.join("trusted-keys"), &bundle, &root);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let installed = root.join("opt/exk8s/etcd/v3.6.10/etcd");
        if etcd_digest.is_none() {
            assert_eq!(out.status.code(), Some(0), "{stderr}");
            assert_eq!(
                std::fs::read(&installed).unwrap(),
                b"#!/bin/sh\necho etcd\n"
            );
            assert_eq!(
                std::fs::read(root.join("usr/local/bin/etcdutl")).unwrap(),
                b"#!/bin/sh\necho etcdutl\n"
            );
        } else {
            assert_eq!(out.status.code(), Some(5), "{stderr}");
            assert!(stderr.contains("digest mismatch"), "{stderr}");
            assert!(
                !installed.exists(),
                "a download with the wrong digest was installed"
            );
        }
    }
}

#[test]
fn a_bad_artifact_catalog_stops_the_start_naming_the_entry() {
    let dir = tempfile::tempdir().unwrap();
    let catalog_path = dir.path().join("artifacts.toml");
    std::fs::write(
        &catalog_path,
        "[[artifact]]\nname = \"etcd\"\nversion = \"v3.6.10\"\nurl = \"https://mirror.example/etcd.tgz\"\nsha256 = \"abc\"\n",
    )
    .unwrap();
    let out = Command::new(binary("exk8s-api"))
        .args(["dev", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("dev"))
        .arg("--artifact-catalog")
        .arg(&catalog_path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&catalog_path.display().to_string())
            && stderr.contains("artifact #1: sha256"),
        "{stderr}"
    );
}
