//! Day 2 on a booted three-member cluster: a rollout, each node's sync unit started as its
//! timer starts it, and a reboot — each while the first machine samples every other
//! apiserver's `/readyz`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use exk8s_tests::bins::KUBERNETES_VERSION;
use exk8s_tests::cluster::operator;
use exk8s_tests::dev::Stack;
use exk8s_tests::machine::Machine;

use super::nodes;

/// `kubectl` on `machine` with its admin kubeconfig (the kubectl of the release the node was
/// founded at, which stays beside a newer one).
pub(crate) fn kubectl(machine: &Machine, args: &[&str]) -> std::process::Output {
    let kubectl = format!("/opt/exk8s/kubernetes/{KUBERNETES_VERSION}/kubectl");
    let mut all = vec!["--kubeconfig", "/etc/exk8s/kubeconfig/admin.kubeconfig"];
    all.extend_from_slice(args);
    machine.run(&kubectl, &all)
}

/// One round of `/readyz` asked of each apiserver in `ips` from `sampler`'s LAN (anonymous, as
/// a load balancer's health check asks): what each answered.
fn readyz_round(sampler: &Machine, ips: &[String]) -> Vec<(String, String)> {
    ips.iter()
        .map(|ip| {
            let out = sampler
                .on_lan("curl")
                .args(["-sSk", "--max-time", "5"])
                .arg(format!("https://{ip}:6443/readyz"))
                .output()
                .unwrap();
            // `ok`, or what failed: the checks a 500 names (`[-]…`), or curl's error.
            let said = String::from_utf8_lossy(&out.stdout);
            let failed: Vec<&str> = said.lines().filter(|l| l.starts_with("[-]")).collect();
            let answer = if failed.is_empty() {
                said.trim().to_owned() + String::from_utf8_lossy(&out.stderr).trim()
            } else {
                failed.join("; ")
            };
            (ip.clone(), answer)
        })
        .collect()
}

/// Samples rounds of [`readyz_round`] every few hundred milliseconds while `change` runs.
fn sampling<T: Send>(
    sampler: &Machine,
    ips: &[String],
    change: impl FnOnce() -> T + Send,
) -> (T, Vec<Vec<(String, String)>>) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let samples = s.spawn(|| {
            let mut rounds = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                rounds.push(readyz_round(sampler, ips));
                std::thread::sleep(Duration::from_millis(300));
            }
            rounds
        });
        let changed = change();
        stop.store(true, Ordering::Relaxed);
        (changed, samples.join().unwrap())
    })
}

/// Each control-plane node's running kube-apiserver container: when it started.
fn apiserver_starts(sampler: &Machine, names: &[&String]) -> BTreeMap<String, String> {
    names
        .iter()
        .map(|name| {
            let pod = format!("kube-apiserver-{name}");
            let started = r"jsonpath={.status.containerStatuses[0].state.running.startedAt}";
            let out = kubectl(
                sampler,
                &[
                    "get",
                    "pod",
                    "--namespace",
                    "kube-system",
                    &pod,
                    "-o",
                    started,
                ],
            );
            let started = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            ((*name).clone(), started)
        })
        .collect()
}

/// A rollout on booted machines: asked of the API, then every node's sync unit started (what
/// its timer runs) over and over, all at once, until every node has applied its new
/// generation. The API hands one control-plane node at a time its bundle while the others are
/// healthy: in every round of samples the first machine took meanwhile, at least two of the
/// three apiservers answered `ok`, and every apiserver was restarted (its new certificates).
pub(crate) fn roll_out(stack: &Stack, cluster: i64, machines: &[Machine], cp: &[(String, String)]) {
    let (sampler, ips) = (
        &machines[0],
        cp.iter().map(|(ip, _)| ip.clone()).collect::<Vec<_>>(),
    );
    let names: Vec<&String> = cp.iter().map(|(_, name)| name).collect();
    let before = apiserver_starts(sampler, &names);
    assert!(before.values().all(|s| !s.is_empty()), "{before:?}");
    let started = operator(stack, "POST", &format!("/clusters/{cluster}/rollout")).call();
    assert!(started.is_ok(), "{started:?}");
    let ((), rounds) = sampling(sampler, &ips, || {
        syncing(machines, || {
            nodes(stack, cluster)
                .iter()
                .all(|n| n["up_to_date"] == true)
        });
    });
    assert_two_ready("rollout", &rounds);
    for machine in machines {
        let sync = machine.show("exk8s-agent-sync.service", &["Result"]);
        assert_eq!(sync, "Result=success", "{}", machine.name);
    }
    exk8s_tests::procs::wait_until("every apiserver restarted", Duration::from_secs(60), || {
        let after = apiserver_starts(sampler, &names);
        before
            .iter()
            .all(|(name, started)| !after[name].is_empty() && after[name] != *started)
    });
}

/// Starts every machine's sync unit (what its timer runs) over and over, all at once, until
/// `done` says the change is over.
fn syncing(machines: &[Machine], done: impl Fn() -> bool) {
    let synced = AtomicBool::new(false);
    std::thread::scope(|s| {
        for machine in machines {
            let synced = &synced;
            s.spawn(move || {
                while !synced.load(Ordering::Relaxed) {
                    machine.assert_up();
                    let _ = machine.run("systemctl", &["start", "exk8s-agent-sync.service"]);
                    // A "wait" answer ends the unit at once: a few seconds apart, as systemd's
                    // start limit (5 in 10 s) allows.
                    std::thread::sleep(Duration::from_secs(3));
                }
            });
        }
        exk8s_tests::procs::wait_until("the change", Duration::from_secs(900), &done);
        synced.store(true, Ordering::Relaxed);
    });
}

/// In every round of samples at least two of the three apiservers answered `ok`.
fn assert_two_ready(change: &str, rounds: &[Vec<(String, String)>]) {
    let short: Vec<_> = rounds
        .iter()
        .filter(|round| round.iter().filter(|(_, a)| a == "ok").count() < 2)
        .collect();
    assert!(rounds.len() >= 10, "{change}: {rounds:?}");
    assert!(
        short.is_empty(),
        "{change}: {} of {} rounds found fewer than two apiservers ready: {short:?}",
        short.len(),
        rounds.len()
    );
    let down = rounds.iter().flatten().filter(|(_, a)| a != "ok").count();
    eprintln!(
        "{change}: {} rounds of /readyz, {down} answers not ok (never two in one round)",
        rounds.len()
    );
}

/// Reboots the last control-plane member (machine 2, a joiner that completed) while the
/// first machine asks the two others' apiservers for `/readyz` every few hundred
/// milliseconds: every answer is `ok`. Booted again from its disk, its boot unit finds
/// `bootstrap.done` and syncs, etcd, containerd and the kubelet come back, and its node is
/// Ready again.
pub(crate) fn reboot_the_last_member(
    stack: &Stack,
    machines: &mut Vec<Machine>,
    vms: &[(i64, String, &str)],
    names: &BTreeMap<i64, String>,
) {
    let rebooted = machines.remove(2);
    let vm = rebooted.vm;
    let others: Vec<String> = vms[..2].iter().map(|(_, ip, _)| ip.clone()).collect();
    let sampler = &machines[0];
    let (again, rounds) = sampling(sampler, &others, || {
        rebooted.stop();
        let again = Machine::start(stack, vm);
        again.wait_booted();
        exk8s_tests::procs::wait_until(
            "the rebooted member's agent",
            Duration::from_secs(300),
            || {
                let Ok(agent) = again.try_show("exk8s-agent.service", &["ActiveState", "Result"])
                else {
                    again.assert_up();
                    return false;
                };
                assert!(
                    !agent.contains("Result=exit-code"),
                    "the agent failed after the reboot: {}",
                    again.journal("exk8s-agent.service", 40)
                );
                agent.contains("ActiveState=active")
            },
        );
        let name = &names[&vms[2].0];
        exk8s_tests::procs::wait_until("the rebooted node Ready", Duration::from_secs(120), || {
            let ready = r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#;
            let out = kubectl(sampler, &["get", "node", name, "-o", ready]);
            String::from_utf8_lossy(&out.stdout).trim() == "True"
        });
        again
    });
    let samples: Vec<_> = rounds.into_iter().flatten().collect();
    let failed: Vec<_> = samples.iter().filter(|(_, a)| a != "ok").collect();
    assert!(samples.len() >= 10, "{samples:?}");
    assert!(
        failed.is_empty(),
        "{} of {} samples failed: {failed:?}",
        failed.len(),
        samples.len()
    );
    let journal = again.journal("exk8s-agent.service", 200);
    assert!(
        journal.contains("bootstrap.done") || journal.contains("sync"),
        "{journal}"
    );
    for unit in ["etcd.service", "containerd.service", "kubelet.service"] {
        assert_eq!(
            again.ok("systemctl", &["is-active", unit]),
            "active",
            "{unit}"
        );
    }
    machines.insert(2, again);
}
