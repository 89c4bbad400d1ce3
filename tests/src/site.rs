//! A site whose machines boot: the package and artifact mirror ([`Mirror`]), the registry
//! ([`Registry`]), the node image baked for them as an image builder bakes it, and the dev
//! stack that boots every VM it makes from that image (`exk8s-api dev --machines nspawn`) —
//! what every booted cluster's test starts from. [`Site::wait_complete`] then waits until each
//! machine of a founded cluster has booted and its agent reported its first boot complete.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::bins::{KUBERNETES_VERSION, NEXT_KUBERNETES_VERSION};
use crate::cluster::view;
use crate::dev::{MANY_AGENTS, Stack, start_dev_on};
use crate::machine::{Machine, agent_toml, bake_image, dev_args, signing_key};
use crate::mirror::Mirror;
use crate::procs::free_port;
use crate::registry::Registry;

/// What booted machines reach on the host, and the image they boot.
pub struct Site {
    pub mirror: Mirror,
    pub registry: Registry,
    /// The baked image every VM boots.
    pub image: PathBuf,
    /// The stack's data directory (its signing key, made before the image was baked).
    data: PathBuf,
    /// The port the stack listens on, which the image's agent names.
    port: u16,
}

impl Site {
    /// Lays the mirror out (serving it unless `mirror_away`: [`Mirror::start`] later), serves
    /// the registry, and bakes the image in `dir`: the agent naming the stack's API, the
    /// mirror as its apt source, the registry as containerd's mirror of registry.k8s.io and
    /// ghcr.io.
    pub fn prepare(dir: &Path, mirror_away: bool) -> Self {
        let mut mirror = Mirror::lay_out(&dir.join("mirror"));
        if !mirror_away {
            mirror.start();
        }
        let registry = Registry::serve(dir);
        let (data, port) = (dir.join("dev"), free_port());
        let keys = signing_key(&data, dir);
        let image = bake_image(dir, &keys, &agent_toml(port), |root| {
            std::fs::write(root.join("etc/apt/sources.list"), mirror.apt_source()).unwrap();
            for upstream in Registry::MIRRORED {
                let hosts = root.join("etc/containerd/certs.d").join(upstream);
                std::fs::create_dir_all(&hosts).unwrap();
                std::fs::write(hosts.join("hosts.toml"), registry.hosts_toml(upstream)).unwrap();
            }
        });
        Self {
            mirror,
            registry,
            image,
            data,
            port,
        }
    }

    /// The dev stack on this site, its addresses from `sim_cidr`, its log `dir/api.log`:
    /// machines booting from the image and reaching the mirror and the registry, the mirror's
    /// artifact catalog, both releases the mirror holds, `extra` arguments and `env`.
    pub fn start_stack(
        &self,
        dir: &Path,
        sim_cidr: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Stack {
        let mut args: Vec<String> = MANY_AGENTS.map(str::to_owned).to_vec();
        args.extend([
            "--artifact-catalog".to_owned(),
            self.mirror.catalog().display().to_string(),
            "--kubernetes-versions".to_owned(),
            format!("{KUBERNETES_VERSION},{NEXT_KUBERNETES_VERSION}"),
        ]);
        args.extend(dev_args(
            &self.image,
            &[self.mirror.port, self.registry.port],
        ));
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        start_dev_on(
            self.port,
            &self.data,
            sim_cidr,
            &dir.join("api.log"),
            &args,
            env,
        )
    }
}

/// The `nodes` of `GET /clusters/{id}`.
pub fn nodes(stack: &Stack, cluster: i64) -> Vec<Value> {
    view(stack, cluster)["nodes"].as_array().unwrap().clone()
}

/// The ids of the VMs the compute API knows, in order.
pub fn sim_vm_ids(stack: &Stack) -> Vec<i64> {
    let vms: Vec<Value> = crate::dev::http()
        .get(&format!("{}/sim/compute/v1/vms", stack.base))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    let mut ids: Vec<i64> = vms.iter().map(|vm| vm["id"].as_i64().unwrap()).collect();
    ids.sort_unstable();
    ids
}

/// Waits until the machine of each of `vms` has booted and every node of `cluster` reports
/// its first boot `complete` (within `within`); the machines, in `vms`' order.
pub fn wait_complete(stack: &Stack, cluster: i64, vms: &[i64], within: Duration) -> Vec<Machine> {
    let machines: Vec<Machine> = vms.iter().map(|vm| Machine::of(stack, *vm)).collect();
    for machine in &machines {
        machine.wait_booted();
    }
    crate::procs::wait_until("every node's first boot", within, || {
        machines.iter().for_each(Machine::assert_up);
        let nodes = nodes(stack, cluster);
        nodes.len() == vms.len() && nodes.iter().all(|n| n["phase"] == "complete")
    });
    machines
}
