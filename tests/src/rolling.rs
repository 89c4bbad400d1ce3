//! A real three-node control plane changed one node at a time, as its agents and a kubelet
//! would change it: each node syncs (`exk8s-agent sync`), the harness restarts what the apply
//! changed (etcd when the agent restarted its unit, a static pod when its manifest changed — at
//! the release its image names), and the node must be ready again before the next one syncs.
//! Availability is sampled meanwhile ([`crate::availability`]).

use std::path::Path;
use std::time::Duration;

use crate::availability::Shared;
use crate::cluster::{Booted, agent_ok};
use crate::control_plane::{Node, kubectl_until};
use crate::netns::Lan;

/// How long a restarted node may take to be ready.
pub const READY: Duration = Duration::from_secs(120);

/// Writes a fresh operator kubeconfig of `cluster` to `to`.
pub fn operator_kubeconfig(stack: &crate::dev::Stack, cluster: i64, to: &Path) {
    std::fs::write(to, crate::cluster::operator_kubeconfig(stack, cluster)).unwrap();
}

/// The three nodes, driven one at a time.
pub struct Rolling<'a> {
    pub booted: &'a Booted,
    pub lan: &'a Lan,
    pub nodes: Vec<Node>,
    pub shared: &'a Shared,
}

impl<'a> Rolling<'a> {
    /// Starts every node's etcd, then its static pods, and waits until each is ready.
    pub fn start(booted: &'a Booted, lan: &'a Lan, shared: &'a Shared) -> Self {
        let mut rolling = Self {
            booted,
            lan,
            nodes: booted
                .roots
                .iter()
                .enumerate()
                .map(|(i, r)| Node::new(r, i))
                .collect(),
            shared,
        };
        for node in &mut rolling.nodes {
            node.start_etcd(lan);
        }
        for node in &mut rolling.nodes {
            node.sync_static_pods(lan);
        }
        for i in 0..3 {
            rolling.wait_ready(i);
        }
        rolling
    }

    /// Node `i`'s apiserver answers `/readyz` with `ok`, through its super-admin kubeconfig.
    pub fn wait_ready(&mut self, i: usize) {
        let config = self.booted.roots[i].join("etc/exk8s/kubeconfig/super-admin.kubeconfig");
        let mut all: Vec<&mut Node> = self.nodes.iter_mut().collect();
        let ready = kubectl_until(
            self.lan,
            &mut all,
            i,
            &config,
            &["get", "--raw", "/readyz"],
            READY,
        );
        assert_eq!(ready, "ok");
    }

    /// Every node syncs once, one at a time, each restarted from its new files and ready again
    /// before the next; how many processes were restarted.
    pub fn sync_round(&mut self) -> usize {
        (0..3).map(|i| self.sync(i)).sum()
    }

    /// Node `i`'s agent syncs in its namespace and waits, for real, for what it restarts
    /// (each wait at most `wait_cap`; the agent's test hook), while the harness restarts what
    /// the agent changed as the kubelet and systemd would — so a component that never gets
    /// healthy fails the sync, and the files the agent then puts back are restarted too. Node
    /// `i` is ready again at the end; the agent's output.
    pub fn sync_waiting(&mut self, i: usize, wait_cap: Duration) -> std::process::Output {
        let vm = self.booted.founded.vms[i];
        let (mut agent, _api) = crate::cluster::agent_inside(
            self.lan,
            i,
            &self.booted.stack,
            &self.booted.founded,
            &self.booted.roots[i],
            vm,
            "sync",
            wait_cap,
        );
        self.shared.set_changing(Some(i));
        let out = self.nodes[i].run_agent(self.lan, &mut agent);
        self.wait_ready(i);
        self.shared.set_changing(None);
        out
    }

    /// Node `i` syncs, is restarted from its new files and is ready again; how many processes
    /// were restarted.
    pub fn sync(&mut self, i: usize) -> usize {
        let vm = self.booted.founded.vms[i];
        agent_ok(
            &self.booted.stack,
            &self.booted.founded,
            &self.booted.roots[i],
            vm,
            "sync",
        );
        self.shared.set_changing(Some(i));
        let mut restarted = usize::from(self.nodes[i].sync_etcd(self.lan));
        restarted += self.nodes[i].sync_static_pods(self.lan).len();
        self.wait_ready(i);
        self.shared.set_changing(None);
        restarted
    }
}
