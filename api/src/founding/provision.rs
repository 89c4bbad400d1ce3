//! The founding worker's provisioning, once the PKI is made: the cluster's security group
//! (unless it brought its own), one journaled VM per ordinal, their addresses, the nodes'
//! serving certificates and the operator's kubeconfig, and the rows — nodes, certificates and
//! `founded` — in one transaction.

use std::collections::BTreeMap;
use std::sync::Arc;

use exk8s_common::contract::Role;

use super::request::ClusterSpecRequest;
use super::{Failure, Founded, Founder, release};
use crate::compute::{CreateSecurityGroup, CreateVm, Rule, Subnet, Vm};
use crate::db::{self, nodes::NewNode, phase::ClusterPhase, resources::Kind};
use crate::machines::{self, NewMachine};
use crate::pki::kubeconfig::{self, KubeconfigSpec};
use crate::pki::{ClientIdentity, ClusterNetwork, ClusterPki, NodeAddresses, NodeServingCerts};
use crate::trust;

/// Journals `kind` with `client_token` (committed), returning the journal row id.
async fn journal(ctx: &Founder, cluster_id: i64, kind: Kind, token: &str) -> Result<i64, Failure> {
    let intent = db::resources::Intent {
        cluster_id,
        kind,
        client_token: token,
        ordinal: None,
        pool_id: None,
    };
    db::resources::journal_intent(&ctx.db, &intent, db::now())
        .await
        .map_err(Failure::db)
}

/// The cluster being founded and where its machines go.
pub(super) struct Target<'a> {
    pub id: i64,
    pub name: &'a str,
    pub network: &'a ClusterNetwork,
    pub subnet: &'a Subnet,
}

pub(super) async fn provision(
    ctx: &Founder,
    target: &Target<'_>,
    spec: &ClusterSpecRequest,
    pki: &Arc<ClusterPki>,
    created: &mut release::Created,
) -> Result<Founded, Failure> {
    let Target {
        id: cluster_id,
        name,
        network,
        ..
    } = *target;
    let groups = security_groups(ctx, target, spec, created).await?;

    let userdata = ctx
        .machines
        .userdata()
        .map_err(|e| Failure::internal("userdata", e))?;
    let mut vms: Vec<Vm> = Vec::new();
    for ordinal in 1..=spec.control_plane_count {
        let tags = BTreeMap::from([
            ("exk8s.io/role".to_owned(), "control-plane".to_owned()),
            ("exk8s.io/cluster".to_owned(), cluster_id.to_string()),
            ("exk8s.io/ordinal".to_owned(), ordinal.to_string()),
        ]);
        let machine = NewMachine {
            cluster_id,
            ordinal,
            pool_id: None,
            vm: CreateVm {
                name: format!("{name}-cp-{ordinal}"),
                image_id: spec.control_plane_image_id,
                instance_type: spec.control_plane_instance_type.clone(),
                zone_id: spec.zone_id,
                subnet_id: spec.subnet_id,
                security_group_ids: groups.clone(),
                allocate_public_ipv4: spec.allocate_public_ipv4,
                ssh_pubkey: spec.ssh_pubkey.clone(),
                root_volume_size_gib: spec.root_volume_size_gib,
                userdata: userdata.clone(),
                tags,
                client_token: String::new(),
            },
        };
        let vm = machines::create(&ctx.machines, machine).await?;
        created.vms.push(vm.id);
        db::clusters::set_phase(
            &ctx.db.pool,
            cluster_id,
            ClusterPhase::Provisioning,
            db::now(),
        )
        .await
        .map_err(Failure::db)?;
        vms.push(vm);
    }

    let mut nodes = Vec::with_capacity(vms.len());
    for (index, vm) in vms.iter().enumerate() {
        let vm = machines::wait_for_address(&ctx.machines, vm.id).await?;
        let name = trust::node_name(cluster_id, trust::CONTROL_PLANE_GROUP, vm.id)
            .map_err(|e| Failure::internal("node name", e))?;
        let addresses = machines::addresses(&vm, name)?;
        nodes.push((vm, index as i64 + 1, addresses));
    }

    // Serving certificates per node, made now and stored, so bundles are pure rendering.
    let pki_for_certs = Arc::clone(pki);
    let network_for_certs = network.clone();
    let addresses: Vec<NodeAddresses> = nodes.iter().map(|(_, _, a)| a.clone()).collect();
    let now = ctx.clock.now();
    let (serving, admin) = ctx
        .cpu
        .run(move || {
            let serving = addresses
                .iter()
                .map(|a| NodeServingCerts::generate(&pki_for_certs, a, &network_for_certs, now))
                .collect::<Result<Vec<_>, _>>()?;
            let admin = ClientIdentity::Admin.issue(&pki_for_certs, now)?;
            Ok::<_, crate::pki::PkiError>((serving, admin))
        })
        .await
        .map_err(|e| Failure::internal("certificates", e))?
        .map_err(|e| Failure::internal("certificates", e))?;
    let server = format!("https://{}:6443", network.control_plane_dns_name);
    let (user, _) = ClientIdentity::Admin.subject();
    let admin_kubeconfig = kubeconfig::render(&KubeconfigSpec {
        cluster_name: name,
        server: &server,
        ca_pem: pki.cluster_ca.cert_pem(),
        user: &user,
        credentials: &admin,
    });

    let now = db::now();
    for (vm, ..) in &nodes {
        // A compute service that reuses an id (or a simulator restarted without its state)
        // would make two nodes one: an upstream fault, reported as such.
        let taken = db::nodes::find_by_vm(&ctx.db.pool, vm.id)
            .await
            .map_err(Failure::db)?;
        if let Some(existing) = taken {
            return Err(Failure::upstream(
                "node records",
                format!(
                    "the compute API returned VM id {} for a new machine, but that id already \
                     belongs to a node of cluster {}",
                    vm.id, existing.cluster_id
                ),
            ));
        }
    }
    let mut tx = ctx.db.begin().await.map_err(Failure::db)?;
    record_nodes(ctx, &mut tx, cluster_id, &nodes, &serving, now).await?;
    let mut issued = crate::certificates::cas(pki).to_vec();
    issued.push(crate::certificates::operator_kubeconfig_cert(&admin));
    crate::certificates::record(&mut tx, cluster_id, None, &issued, now)
        .await
        .map_err(|e| match e {
            // A full disk or a lost database is the database's answer (503), not a defect.
            crate::certificates::CertificatesError::Db(db) => Failure::db(db),
            other => Failure::internal("recording certificates", other),
        })?;
    db::clusters::set_phase(&mut *tx, cluster_id, ClusterPhase::Founded, now)
        .await
        .map_err(Failure::db)?;
    tx.commit().await.map_err(Failure::db)?;
    tracing::info!(cluster_id, nodes = nodes.len(), "cluster founded");
    // The new nodes will all ask for their bundles at once: make an RSA cluster's keys now.
    ctx.key_pool.refresh_cluster(&ctx.db.pool, cluster_id).await;

    let node_ips = nodes
        .iter()
        .map(|(_, _, a)| a.public_ipv4.unwrap_or(a.private_ipv4).to_string())
        .collect();
    Ok(Founded {
        id: cluster_id,
        name: name.to_owned(),
        dns_name: String::new(),
        vm_ids: nodes.iter().map(|(vm, ..)| vm.id).collect(),
        admin_kubeconfig,
        dns_configured: false,
        dns_error: None,
        node_ips,
    })
}

/// The security groups the cluster's machines join: those asked for, or else one made for
/// the cluster (journaled first) that opens the subnet to itself and 6443 to all.
async fn security_groups(
    ctx: &Founder,
    target: &Target<'_>,
    spec: &ClusterSpecRequest,
    created: &mut release::Created,
) -> Result<Vec<i64>, Failure> {
    let Target {
        id: cluster_id,
        name,
        subnet,
        ..
    } = *target;
    let compute = &ctx.machines.compute;
    let mut groups = spec.security_group_ids.clone();
    if groups.is_empty() {
        let token = format!("cluster-{cluster_id}-sg");
        let journal_id = journal(ctx, cluster_id, Kind::SecurityGroup, &token).await?;
        let group = compute
            .create_security_group(&CreateSecurityGroup {
                name: format!("{name}-control-plane"),
                subnet_id: subnet.id,
                rules: vec![
                    Rule {
                        protocol: "all".into(),
                        port: None,
                        source_cidr: subnet.cidr.clone(),
                    },
                    Rule {
                        protocol: "tcp".into(),
                        port: Some(6443),
                        source_cidr: "0.0.0.0/0".into(),
                    },
                ],
                client_token: token,
            })
            .await
            .map_err(|e| Failure::compute("security group creation", e))?;
        created.security_group = Some(group.id);
        db::resources::set_state(
            &ctx.db.pool,
            journal_id,
            "created",
            Some(&group.id.to_string()),
            db::now(),
        )
        .await
        .map_err(Failure::db)?;
        db::clusters::set_security_group(&ctx.db.pool, cluster_id, group.id, db::now())
            .await
            .map_err(Failure::db)?;
        groups.push(group.id);
    }
    Ok(groups)
}

/// Each new node's row, its etcd member's and its apiserver's serving certificates (keys
/// sealed), in the caller's transaction.
async fn record_nodes(
    ctx: &Founder,
    tx: &mut db::Tx,
    cluster_id: i64,
    nodes: &[(Vm, i64, NodeAddresses)],
    serving: &[NodeServingCerts],
    now: i64,
) -> Result<(), Failure> {
    for ((vm, ordinal, addresses), certs) in nodes.iter().zip(serving) {
        let node_id = db::nodes::insert(
            &mut *tx,
            &NewNode {
                cluster_id,
                ordinal: *ordinal,
                vm_id: vm.id,
                node_name: addresses.name.as_str(),
                private_ipv4: &addresses.private_ipv4.to_string(),
                private_ipv6: addresses.private_ipv6.map(|a| a.to_string()).as_deref(),
                public_ipv4: addresses.public_ipv4.map(|a| a.to_string()).as_deref(),
                is_initial: *ordinal == 1,
                role: Role::ControlPlane,
                pool_id: None,
                etcd_membership: Some(db::phase::EtcdMembership::Voter),
            },
            now,
        )
        .await
        .map_err(Failure::db)?;
        let seal = |column: trust::NodeKeyColumn, cert| {
            trust::seal_node_key(&ctx.keks, cluster_id, vm.id, column, cert)
                .map_err(|e| Failure::internal("sealing", e))
        };
        db::nodes::insert_etcd_member(
            &mut *tx,
            node_id,
            (
                &certs.etcd_server.cert_pem,
                &seal(trust::NodeKeyColumn::EtcdServer, &certs.etcd_server)?,
            ),
            (
                &certs.etcd_peer.cert_pem,
                &seal(trust::NodeKeyColumn::EtcdPeer, &certs.etcd_peer)?,
            ),
        )
        .await
        .map_err(Failure::db)?;
        db::nodes::insert_apiserver_node(
            &mut *tx,
            node_id,
            &certs.apiserver.cert_pem,
            &seal(trust::NodeKeyColumn::Apiserver, &certs.apiserver)?,
        )
        .await
        .map_err(Failure::db)?;
    }
    Ok(())
}
