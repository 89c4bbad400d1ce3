//! Scaling a booted control plane 1 → 3 → 1 (`PATCH control_plane_count`): each new member's
//! machine boots from the image, its agent adds it to etcd as a learner through the voters,
//! systemd starts its etcd, the agent promotes it and the kubelet starts its control plane;
//! then every member takes its new generation one at a time (each apiserver's
//! `--etcd-servers` follows). Shrinking, the oldest member's agent removes the newest member
//! from etcd, its VM goes, and the others follow. Every node's sync unit is started again and
//! again meanwhile, as its timer would, and the first machine sends `GET /version` through its
//! node-local balancer every few hundred milliseconds: every request is answered, from one
//! apiserver to three and back, and the balancer says each removed member's apiserver is no
//! longer listed. A ConfigMap written before the first change is read from every apiserver at
//! three members and from the last one at the end; etcd has as many voters as members, and
//! every VM but the first is released.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use exk8s_tests::cluster::{operator, view};
use exk8s_tests::machine::Machine;
use exk8s_tests::site::nodes;
use serde_json::{Value, json};

use super::control_plane::{admin, etcdctl};
use super::one_node::OneNode;

/// `GET /version` through `sampler`'s node-local balancer: `ok`, or what failed.
fn through_balancer(sampler: &Machine) -> String {
    let out = sampler
        .on_lan("curl")
        .args(["-sSk", "--max-time", "5", "-w", "\n%{http_code}"])
        .arg("https://127.0.0.1:7445/version")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    if said.ends_with("\n200") && said.contains("\"gitVersion\"") {
        "ok".to_owned()
    } else {
        format!("{said} {}", String::from_utf8_lossy(&out.stderr).trim())
    }
}

/// The control plane's members as the API lists them: VM id → address.
fn members(node: &OneNode<'_>) -> BTreeMap<i64, String> {
    nodes(node.stack, node.cluster)
        .iter()
        .filter(|n| n["role"] == "control-plane" && n["private_ipv4"].is_string())
        .map(|n| {
            (
                n["vm_id"].as_i64().unwrap(),
                n["private_ipv4"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Asks for `count` members, then starts every member's sync unit (without waiting for it)
/// every few seconds — new members' too, once their machines run — until the API says the
/// control plane has `count` voters, none joining or leaving, and every node runs its newest
/// generation. `extra` holds the machines beside the first, by VM id; members gone are
/// dropped from it.
fn scaled(node: &OneNode<'_>, count: u64, extra: &mut BTreeMap<i64, Machine>) {
    let asked = operator(node.stack, "PATCH", &format!("/clusters/{}", node.cluster))
        .send_json(json!({"control_plane_count": count}));
    assert!(asked.is_ok(), "PATCH to {count}: {asked:?}");
    let first = node.machine.vm;
    let want = json!({"desired": count, "voters": count, "joining": 0, "leaving": 0});
    exk8s_tests::procs::wait_until(
        &format!("{count} members"),
        Duration::from_secs(900),
        || {
            let listed = members(node);
            extra.retain(|vm, _| listed.contains_key(vm));
            for vm in listed.keys().filter(|vm| **vm != first) {
                if !extra.contains_key(vm) {
                    extra.insert(*vm, Machine::of(node.stack, *vm));
                }
            }
            for machine in std::iter::once(&node.machine).chain(extra.values()) {
                let _ = machine.run(
                    "systemctl",
                    &["start", "--no-block", "exk8s-agent-sync.service"],
                );
            }
            std::thread::sleep(Duration::from_secs(3));
            let cluster = view(node.stack, node.cluster);
            let all = nodes(node.stack, node.cluster);
            cluster["control_plane_members"] == want
                && all.len() == usize::try_from(count).unwrap()
                && all.iter().all(|n| n["up_to_date"] == true)
        },
    );
}

/// etcd's members through the first node's etcd: (peer URL, is learner) each.
fn etcd_members(node: &OneNode<'_>) -> Vec<(String, bool)> {
    let out = etcdctl(&node.machine, &node.ip, &["member", "list", "-w", "json"]);
    assert!(out.status.success(), "{out:?}");
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    list["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["peerURLs"][0].as_str().unwrap_or_default().to_owned(),
                m["isLearner"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

/// The module doc, on `node`'s cluster of one member.
pub(crate) fn one_three_one(node: &OneNode<'_>) {
    let first = &node.machine;
    admin(
        first,
        &[
            "create",
            "configmap",
            "scale-marker",
            "--from-literal=written=before-scaling",
        ],
    );
    let marker = |machine: &Machine| {
        admin(
            machine,
            &[
                "get",
                "configmap",
                "scale-marker",
                "-o",
                "jsonpath={.data.written}",
            ],
        )
    };
    let stop = AtomicBool::new(false);
    let mut extra = BTreeMap::new();
    let (removed, answers) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let (start, mut answers) = (std::time::Instant::now(), Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let answer = through_balancer(first);
                answers.push(if answer == "ok" {
                    answer
                } else {
                    format!("at {:.1}s: {answer}", start.elapsed().as_secs_f64())
                });
                std::thread::sleep(Duration::from_millis(300));
            }
            answers
        });
        let _stop = exk8s_tests::procs::SetOnDrop(&stop);
        scaled(node, 3, &mut extra);
        let at_three = etcd_members(node);
        assert_eq!(at_three.len(), 3, "{at_three:?}");
        assert!(at_three.iter().all(|(_, learner)| !learner), "{at_three:?}");
        for machine in std::iter::once(first).chain(extra.values()) {
            assert_eq!(marker(machine), "before-scaling", "{}", machine.name);
        }
        let removed: Vec<String> = members(node)
            .into_iter()
            .filter(|(vm, _)| *vm != first.vm)
            .map(|(_, ip)| ip)
            .collect();
        scaled(node, 1, &mut extra);
        drop(_stop);
        (removed, sampler.join().unwrap())
    });
    let failed: Vec<&String> = answers.iter().filter(|a| *a != "ok").collect();
    assert!(answers.len() >= 10, "{answers:?}");
    assert!(
        failed.is_empty(),
        "{} of {} requests through the balancer failed: {failed:?}\n{}",
        failed.len(),
        answers.len(),
        first.journal("exk8s-apiserver-balancer.service", 300)
    );
    eprintln!(
        "scaling 1 → 3 → 1: {} requests through the first node's balancer, all answered",
        answers.len()
    );
    assert!(extra.is_empty(), "the members gone: {:?}", extra.keys());
    assert_eq!(etcd_members(node).len(), 1);
    assert_eq!(marker(first), "before-scaling");
    let balancer = first.journal("exk8s-apiserver-balancer.service", 2000);
    for ip in &removed {
        let gone = format!("apiserver {ip}:6443 no longer listed");
        assert!(balancer.contains(&gone), "{gone} in {balancer}");
    }
    assert_eq!(removed.len(), 2, "{removed:?}");
    assert_eq!(
        exk8s_tests::members::sim_vm_ids(node.stack),
        [first.vm],
        "every VM released with its member"
    );
}
