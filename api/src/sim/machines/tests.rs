//! What the machine provider decides without booting anything: the DNS records a machine's
//! `/etc/hosts` carries, and the image checks. Booting is proven by `tests/tests/boot.rs`.

#![allow(clippy::unwrap_used, reason = "a test: failures should stop it loudly")]

use super::hosts::{DNS_MARKER, write_zone};
use super::*;

fn records(entries: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    entries
        .iter()
        .map(|(name, ips)| {
            (
                (*name).to_owned(),
                ips.iter().map(|s| (*s).to_owned()).collect(),
            )
        })
        .collect()
}

#[test]
fn a_machines_hosts_file_keeps_its_own_lines_and_follows_the_records() {
    let disk = tempfile::tempdir().unwrap();
    let hosts = disk.path().join("etc/hosts");
    std::fs::create_dir_all(hosts.parent().unwrap()).unwrap();
    std::fs::write(&hosts, "127.0.0.1 localhost\n::1 localhost").unwrap();

    write_hosts(
        disk.path(),
        &records(&[("cp.shop.example", &["10.0.0.11", "10.0.0.12"])]),
    );
    let written = std::fs::read_to_string(&hosts).unwrap();
    assert_eq!(
        written,
        format!(
            "127.0.0.1 localhost\n::1 localhost\n{DNS_MARKER}\n\
             10.0.0.11 cp.shop.example\n10.0.0.12 cp.shop.example\n"
        )
    );

    // The same records: the file is not written again (a resolver keeps its cached copy).
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&hosts).unwrap());
    write_hosts(
        disk.path(),
        &records(&[("cp.shop.example", &["10.0.0.11", "10.0.0.12"])]),
    );
    let again = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&hosts).unwrap());
    assert_eq!(inode, again);

    // A member gone and a name deleted: only the record lines change.
    write_hosts(
        disk.path(),
        &records(&[("cp.shop.example", &["10.0.0.12"])]),
    );
    assert_eq!(
        std::fs::read_to_string(&hosts).unwrap(),
        format!("127.0.0.1 localhost\n::1 localhost\n{DNS_MARKER}\n10.0.0.12 cp.shop.example\n")
    );
    write_hosts(disk.path(), &BTreeMap::new());
    assert_eq!(
        std::fs::read_to_string(&hosts).unwrap(),
        format!("127.0.0.1 localhost\n::1 localhost\n{DNS_MARKER}\n")
    );
    assert!(!disk.path().join("etc/.hosts.exk8s").exists());
}

#[test]
fn an_image_without_the_agent_is_refused_naming_what_it_lacks() {
    let image = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(image.path().join("sbin")).unwrap();
    std::fs::write(image.path().join("sbin/init"), "").unwrap();
    let config = MachineConfig {
        image: image.path().to_owned(),
        dir: image.path().join("machines"),
        prefix: 24,
        forwards: vec![8080],
        cpus: None,
    };
    let refused = config.check().unwrap_err().to_string();
    if rustix::process::geteuid().is_root() {
        assert!(
            refused.contains("no /usr/bin/exk8s-agent")
                && refused.contains("packaging/bake-image.sh"),
            "{refused}"
        );
    } else {
        assert!(refused.contains("needs root"), "{refused}");
    }
}

#[test]
fn the_records_are_a_hosts_file_a_dns_server_can_answer_from() {
    let dir = tempfile::tempdir().unwrap();
    let zone = dir.path().join("dns/hosts");
    write_zone(
        dir.path(),
        &records(&[("cp.shop.example", &["10.0.0.11", "10.0.0.12"])]),
    );
    assert_eq!(
        std::fs::read_to_string(&zone).unwrap(),
        "10.0.0.11 cp.shop.example\n10.0.0.12 cp.shop.example\n"
    );
    // Unchanged records: not written again (a watcher is not woken).
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&zone).unwrap());
    write_zone(
        dir.path(),
        &records(&[("cp.shop.example", &["10.0.0.11", "10.0.0.12"])]),
    );
    let again = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&zone).unwrap());
    assert_eq!(inode, again);
    // A member gone: one line left; no partial file is ever left in the watched directory.
    write_zone(dir.path(), &records(&[("cp.shop.example", &["10.0.0.12"])]));
    assert_eq!(
        std::fs::read_to_string(&zone).unwrap(),
        "10.0.0.12 cp.shop.example\n"
    );
    let entries: Vec<_> = std::fs::read_dir(dir.path().join("dns")).unwrap().collect();
    assert_eq!(entries.len(), 1);
}

#[test]
fn a_new_disk_names_its_machine_and_resolves_that_name_without_dns() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("image");
    std::fs::create_dir_all(image.join("etc")).unwrap();
    std::fs::write(image.join("etc/hosts"), "127.0.0.1 localhost").unwrap();
    // The building host's resolver, as debootstrap leaves it: a link out of the image here.
    let outside = dir.path().join("outside-resolv.conf");
    std::fs::write(&outside, "nameserver 192.0.2.53\n").unwrap();
    std::os::unix::fs::symlink(&outside, image.join("etc/resolv.conf")).unwrap();
    let disk = dir.path().join("disk");
    disk::make(&image, &disk, "shop-cp-1", "10.240.0.1").unwrap();
    let read = |path: &std::path::Path| std::fs::read_to_string(path).unwrap();
    assert_eq!(read(&disk.join("etc/hostname")), "shop-cp-1\n");
    assert_eq!(
        read(&disk.join("etc/hosts")),
        "127.0.0.1 localhost\n127.0.1.1 shop-cp-1\n"
    );
    // The network's resolver, in a file of the disk's own; the link's target untouched.
    assert_eq!(
        read(&disk.join("etc/resolv.conf")),
        "nameserver 10.240.0.1\n"
    );
    assert!(!disk.join("etc/resolv.conf").is_symlink());
    assert_eq!(read(&outside), "nameserver 192.0.2.53\n");
    // The image itself is left as it was, for the next machine.
    assert_eq!(read(&image.join("etc/hosts")), "127.0.0.1 localhost");
}
