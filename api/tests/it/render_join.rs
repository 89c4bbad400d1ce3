//! A control-plane node joining a running cluster, as rendered: its etcd starts into the
//! existing cluster (every member in `ETCD_INITIAL_CLUSTER`, state `existing`), its plan adds it
//! as a learner through the voters before etcd starts and promotes it once etcd runs, and no
//! apiserver is pointed at the learner (a learner refuses client requests) until it votes. The
//! voters' etcd units do not change with membership (only their bootstrap file does), so no
//! member restarts etcd for a join or a removal: with two voters, that would lose quorum.

use std::net::Ipv4Addr;

use exk8s_api::pki::KeyAlgorithm;
use exk8s_api::render::Membership;
use exk8s_common::payload::PlanStep;

use crate::helpers::{control_plane, render_nodes, text};

const ETCD_UNIT: &str = "/etc/systemd/system/etcd.service";
const ETCD_BOOTSTRAP: &str = "/etc/exk8s/config/etcd-bootstrap.env";
const APISERVER: &str = "/etc/kubernetes/manifests/kube-apiserver.yaml";

fn ips() -> Vec<Ipv4Addr> {
    (1..=3).map(|i| Ipv4Addr::new(10, 0, 1, 10 + i)).collect()
}

#[test]
fn a_joining_member_adds_itself_as_a_learner_and_is_promoted() {
    let mut nodes = control_plane(&ips());
    nodes[2].membership = Membership::Joining;
    let rendered = render_nodes(nodes, KeyAlgorithm::EcdsaP256);
    let joining = &rendered.bundles[2];

    let bootstrap = text(joining, ETCD_BOOTSTRAP);
    assert!(
        bootstrap.contains("\nETCD_INITIAL_CLUSTER_STATE=existing\n"),
        "{bootstrap}"
    );
    for ip in ips() {
        assert!(
            bootstrap.contains(&format!("=https://{ip}:2380")),
            "{ip} in {bootstrap}"
        );
    }
    let unit = text(joining, ETCD_UNIT);
    assert!(
        unit.contains(&format!("EnvironmentFile={ETCD_BOOTSTRAP}\n"))
            && !unit.contains("--initial-cluster"),
        "{unit}"
    );
    let voters = ["https://10.0.1.11:2379", "https://10.0.1.12:2379"];
    let peer = "https://10.0.1.13:2380";
    let position = |wanted: &dyn Fn(&PlanStep) -> bool| {
        joining
            .plan
            .iter()
            .position(wanted)
            .unwrap_or_else(|| panic!("missing step in {:?}", joining.plan))
    };
    let join = position(&|s| matches!(s, PlanStep::EtcdJoin { .. }));
    let start = position(
        &|s| matches!(s, PlanStep::EnableStart { unit, .. } if unit.as_str() == "etcd.service"),
    );
    let healthy = position(&|s| matches!(s, PlanStep::WaitEtcdHealthy { .. }));
    let promote = position(&|s| matches!(s, PlanStep::EtcdPromote { .. }));
    let apiserver = position(&|s| matches!(s, PlanStep::InstallStaticPod { .. }));
    assert!(join < start && start < healthy && healthy < promote && promote < apiserver);
    for step in [&joining.plan[join], &joining.plan[promote]] {
        let (v, p, cert) = match step {
            PlanStep::EtcdJoin {
                voters,
                peer_url,
                cert_file,
                ..
            }
            | PlanStep::EtcdPromote {
                voters,
                peer_url,
                cert_file,
                ..
            } => (voters, peer_url, cert_file),
            _ => unreachable!(),
        };
        let v: Vec<String> = v.iter().map(ToString::to_string).collect();
        assert_eq!(v, voters, "through the voters only");
        assert_eq!(p.to_string(), peer);
        assert_eq!(cert.as_str(), "/etc/exk8s/pki/etcd-healthcheck-client.pem");
        assert!(
            joining.file(cert.as_str()).is_some(),
            "the identity is in the bundle"
        );
    }

    // The voters' apiservers use the voters only; a voter's etcd unit stays `new` (its data
    // directory decides once it exists).
    for voter in &rendered.bundles[..2] {
        let manifest = text(voter, APISERVER);
        assert!(
            manifest.contains("--etcd-servers=https://10.0.1.11:2379,https://10.0.1.12:2379"),
            "{manifest}"
        );
        assert!(text(voter, ETCD_BOOTSTRAP).contains("\nETCD_INITIAL_CLUSTER_STATE=new\n"));
        assert!(
            !voter
                .plan
                .iter()
                .any(|s| matches!(s, PlanStep::EtcdJoin { .. } | PlanStep::EtcdPromote { .. }))
        );
    }
}

#[test]
fn membership_changes_only_the_voters_bootstrap_file_never_their_etcd_unit() {
    let two = render_nodes(control_plane(&ips()[..2]), KeyAlgorithm::EcdsaP256);
    let mut nodes = control_plane(&ips());
    nodes[2].membership = Membership::Joining;
    let joining = render_nodes(nodes.clone(), KeyAlgorithm::EcdsaP256);
    nodes[2].membership = Membership::Voter;
    let three = render_nodes(nodes, KeyAlgorithm::EcdsaP256);
    for voter in 0..2 {
        let unit = text(&two.bundles[voter], ETCD_UNIT);
        for after in [&joining, &three] {
            assert_eq!(text(&after.bundles[voter], ETCD_UNIT), unit);
        }
        let (before, after) = (
            text(&two.bundles[voter], ETCD_BOOTSTRAP),
            text(&three.bundles[voter], ETCD_BOOTSTRAP),
        );
        assert!(!before.contains("10.0.1.13") && after.contains("=https://10.0.1.13:2380"));
    }
}
