//! A crash while a control plane grows, with the real `exk8s-api` binary and the compute
//! simulator as its own process, on SQLite and PostgreSQL: a one-member cluster whose node
//! reported healthy is asked for three; SIGKILL once the new member's VM exists but before its
//! node is recorded; the restarted API's reconciler takes the change over, releases the VM the
//! dead process left half-made (never adopting it) and adds the member again — one joining
//! member whose bundle joins etcd through the voter, every VM a recorded node. Killed again
//! while that member joins, the next API lets its join finish: it votes, nothing leaked. The
//! same SIGKILL during a replacement: the replacement is added again. Both run with the
//! provisioning deadline at its default: the dead process's short lease is what runs out.

use std::collections::BTreeSet;
use std::time::Duration;

use exk8s_common::node_auth::NodeKey;
use exk8s_common::payload::PlanStep;
use serde_json::{Value, json};

use crate::app::{Backend, both_backends, fresh_database};
use crate::crash::{Stack, imds_token, stack, token, wait_until};

fn control_plane_vms(vms: &[Value]) -> BTreeSet<i64> {
    vms.iter()
        .filter(|vm| vm["tags"]["exk8s.io/role"] == "control-plane")
        .map(|vm| vm["id"].as_i64().unwrap())
        .collect()
}

/// Fresh credentials of `vm` as the instance-metadata service would issue them, with the
/// org's bootstrap token.
async fn credentials(db_url: &str, vm: i64, bootstrap: &str) -> (String, String) {
    let db = exk8s_api::db::Db::connect(db_url).unwrap();
    (imds_token(&db, vm).await, bootstrap.to_owned())
}

/// `vm`'s agent reports it finished booting (a joining member: joined and promoted).
async fn report_complete(stack: &Stack, vm: i64, (imds, bearer): &(String, String)) {
    let reported = stack
        .http
        .post(format!(
            "{}/bootstrap/control-plane/{vm}/status",
            stack.api_url
        ))
        .header("X-exc-imds-token", imds)
        .bearer_auth(bearer)
        .json(&json!({"phase": "complete", "state": "succeeded", "message": ""}))
        .send()
        .await
        .unwrap();
    assert_eq!(reported.status(), 204, "VM {vm}'s report");
}

/// The node's first fetch (registering a node key); its bundle's plan.
async fn fetch(stack: &Stack, vm: i64, (imds, bearer): &(String, String)) -> Vec<PlanStep> {
    let response = stack
        .http
        .get(format!("{}/bootstrap/control-plane/{vm}", stack.api_url))
        .header(
            "X-Exk8s-Nonce",
            format!("n-{}", uuid::Uuid::new_v4().simple()),
        )
        .header("X-exc-imds-token", imds)
        .bearer_auth(bearer)
        .header(
            "X-Exk8s-Node-Key",
            NodeKey::generate().unwrap().public().to_text(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "bundle of VM {vm}");
    let keys = stack
        .http
        .get(format!("{}/bootstrap/keys", stack.api_url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut ring = exk8s_common::Keyring::new();
    ring.add_pub_text(&keys, "/bootstrap/keys").unwrap();
    exk8s_common::verify(&response.bytes().await.unwrap(), &ring)
        .unwrap()
        .into_payload()
        .plan
}

async fn view(stack: &Stack, operator: &str, cluster: i64) -> Value {
    stack
        .http
        .get(format!("{}/clusters/{cluster}", stack.api_url))
        .bearer_auth(operator)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn nodes(view: &Value) -> BTreeSet<i64> {
    view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["vm_id"].as_i64().unwrap())
        .collect()
}

/// A stack on a fresh database, one API running, a founded 1-node cluster whose node fetched
/// its bundle and reported healthy.
struct OneMember {
    dir: tempfile::TempDir,
    db_url: String,
    stack: Stack,
    operator: String,
    bootstrap: String,
    first: exk8s_tests::procs::Proc,
    cluster: i64,
    voter: i64,
}

async fn one_member(backend: Backend) -> OneMember {
    let dir = tempfile::tempdir().unwrap();
    let db_url = fresh_database(backend, dir.path()).await;
    // The provisioning deadline stays at its default (ten minutes): what lets the restarted API
    // take the change over is the dead holder's lease running out (seconds, lease::TTL).
    let stack = stack(dir.path(), &db_url, 600).await;
    let operator = token(&db_url, "7", "operator");
    let bootstrap = token(&db_url, "7", "bootstrap");
    let first = stack.start_api(&dir.path().join("api-1.log")).await;
    let created: Value = stack
        .found(&stack.api_url, &operator, 1)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let cluster = created["cluster_id"].as_i64().unwrap();
    let voter = created["control_plane_vm_ids"][0].as_i64().unwrap();
    let voter_credentials = credentials(&db_url, voter, &bootstrap).await;
    fetch(&stack, voter, &voter_credentials).await;
    report_complete(&stack, voter, &voter_credentials).await;
    OneMember {
        dir,
        db_url,
        stack,
        operator,
        bootstrap,
        first,
        cluster,
        voter,
    }
}

async fn killed_while_a_member_is_added_then_the_change_goes_on(backend: Backend) {
    let OneMember {
        dir,
        db_url,
        stack,
        operator,
        bootstrap,
        mut first,
        cluster,
        voter,
        ..
    } = one_member(backend).await;

    // Compute is slow and addresses come late: the new member's VM exists for seconds before
    // its node can be recorded.
    stack
        .set_faults(json!({"latency_ms": 100, "address_after_polls": 5}))
        .await;
    let scaled = stack
        .http
        .patch(format!("{}/clusters/{cluster}", stack.api_url))
        .bearer_auth(&operator)
        .json(&json!({"control_plane_count": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(scaled.status(), 202);
    wait_until("the new member's VM", Duration::from_secs(30), || async {
        control_plane_vms(&stack.sim_list("vms").await).len() == 2
    })
    .await;
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    let at_kill = control_plane_vms(&stack.sim_list("vms").await);
    let recorded = recorded_nodes(&db_url, cluster).await;
    assert_eq!(
        recorded,
        BTreeSet::from([voter]),
        "killed before the member was recorded"
    );
    let half_made: BTreeSet<i64> = at_kill.difference(&recorded).copied().collect();
    assert_eq!(half_made.len(), 1, "{at_kill:?}");

    stack.set_faults(json!({})).await;
    let mut second = stack.start_api(&dir.path().join("api-2.log")).await;
    wait_until(
        "the member added again",
        Duration::from_secs(60),
        || async {
            let v = view(&stack, &operator, cluster).await;
            v["control_plane_members"]
                == json!({"desired": 3, "voters": 1, "joining": 1, "leaving": 0})
        },
    )
    .await;
    wait_until(
        "no VM outside the control plane's nodes",
        Duration::from_secs(30),
        || async {
            let v = view(&stack, &operator, cluster).await;
            control_plane_vms(&stack.sim_list("vms").await) == nodes(&v)
        },
    )
    .await;
    let grown = view(&stack, &operator, cluster).await;
    let members = nodes(&grown);
    assert!(
        members.is_disjoint(&half_made),
        "the half-made VM is released, never adopted"
    );
    let joining = grown["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["etcd_membership"] == "joining")
        .unwrap();
    let joiner = joining["vm_id"].as_i64().unwrap();
    let joiner_credentials = credentials(&db_url, joiner, &bootstrap).await;
    let plan = fetch(&stack, joiner, &joiner_credentials).await;
    let voter_ip = grown["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["vm_id"] == voter)
        .unwrap()["private_ipv4"]
        .as_str()
        .unwrap()
        .to_owned();
    let joins_through: Vec<String> = plan
        .iter()
        .find_map(|step| match step {
            PlanStep::EtcdJoin { voters, .. } => {
                Some(voters.iter().map(ToString::to_string).collect())
            }
            _ => None,
        })
        .expect("the new member's bundle joins etcd");
    assert_eq!(joins_through, [format!("https://{voter_ip}:2379")]);

    // Killed again, this time with the member recorded and joining: a third API takes the
    // change over and the member's agent finishes the join — it votes, and the last member
    // waits for every member to apply the generation that gave them (a rollout, not run here).
    second.0.kill().unwrap();
    second.0.wait().unwrap();
    let _third = stack.start_api(&dir.path().join("api-3.log")).await;
    report_complete(&stack, joiner, &joiner_credentials).await;
    wait_until(
        "the joined member voting",
        Duration::from_secs(60),
        || async {
            let v = view(&stack, &operator, cluster).await;
            v["control_plane_members"]
                == json!({"desired": 3, "voters": 2, "joining": 0, "leaving": 0})
        },
    )
    .await;
    let finishing = view(&stack, &operator, cluster).await;
    assert_eq!(
        control_plane_vms(&stack.sim_list("vms").await),
        nodes(&finishing),
        "every VM is a recorded member"
    );
}

/// The VMs the database records as the cluster's nodes (read while no API runs).
async fn recorded_nodes(db_url: &str, cluster: i64) -> BTreeSet<i64> {
    use sqlx::Row as _;
    let db = exk8s_api::db::Db::connect(db_url).unwrap();
    let rows = sqlx::query("SELECT vm_id FROM cluster_nodes WHERE cluster_id = $1")
        .bind(cluster)
        .fetch_all(&db.pool)
        .await
        .unwrap();
    rows.iter().map(|r| r.get::<i64, _>("vm_id")).collect()
}

both_backends!(killed_while_a_member_is_added_then_the_change_goes_on);

/// SIGKILL while a healthy member is being replaced (its replacement's VM exists, its node is
/// not recorded yet), with the provisioning deadline at its default: the restarted API takes the
/// replacement over within seconds (the dead process's lease runs out), releases the half-made
/// VM and adds the replacement again — a joining member, every VM a recorded node.
async fn killed_while_a_member_is_replaced_then_the_replacement_goes_on(backend: Backend) {
    let OneMember {
        dir,
        db_url,
        stack,
        operator,
        mut first,
        cluster,
        voter,
        ..
    } = one_member(backend).await;

    stack
        .set_faults(json!({"latency_ms": 100, "address_after_polls": 5}))
        .await;
    let replaced = stack
        .http
        .post(format!(
            "{}/clusters/{cluster}/nodes/{voter}/replace",
            stack.api_url
        ))
        .bearer_auth(&operator)
        .send()
        .await
        .unwrap();
    assert_eq!(replaced.status(), 202);
    wait_until("the replacement's VM", Duration::from_secs(30), || async {
        control_plane_vms(&stack.sim_list("vms").await).len() == 2
    })
    .await;
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    let at_kill = control_plane_vms(&stack.sim_list("vms").await);
    assert_eq!(
        recorded_nodes(&db_url, cluster).await,
        BTreeSet::from([voter]),
        "killed before the replacement was recorded"
    );

    stack.set_faults(json!({})).await;
    let _second = stack.start_api(&dir.path().join("api-2.log")).await;
    // Within a minute, with the provisioning deadline at ten: the dead process's lease ran out.
    wait_until(
        "the replacement added again",
        Duration::from_secs(60),
        || async {
            let v = view(&stack, &operator, cluster).await;
            v["control_plane_members"]["joining"] == 1
                && control_plane_vms(&stack.sim_list("vms").await) == nodes(&v)
        },
    )
    .await;
    let grown = view(&stack, &operator, cluster).await;
    let half_made: BTreeSet<i64> = at_kill
        .difference(&BTreeSet::from([voter]))
        .copied()
        .collect();
    assert!(
        nodes(&grown).is_disjoint(&half_made),
        "the half-made VM is released, never adopted"
    );
}

both_backends!(killed_while_a_member_is_replaced_then_the_replacement_goes_on);
