//! The cloud's DNS as the machines and their neighbours see it: the DNS simulator's records
//! as `/etc/hosts` lines in every running machine, and as a hosts file a real DNS server on
//! the host can answer from.

use std::collections::BTreeMap;
use std::path::Path;

/// The marker above the `/etc/hosts` lines that stand for the cloud's DNS.
pub(super) const DNS_MARKER: &str =
    "# exk8s dev stack: the cloud's DNS records, kept by the simulator";

/// Rewrites `disk`'s `/etc/hosts` when the records differ from what it says: the image's
/// own lines, then [`DNS_MARKER`] and one line per address of each record. Replaced by a
/// rename, so a resolver never reads it half-written.
pub(super) fn write_hosts(disk: &Path, records: &BTreeMap<String, Vec<String>>) {
    let path = disk.join("etc/hosts");
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    let own = current
        .split_once(DNS_MARKER)
        .map_or(current.as_str(), |(own, _)| own);
    let mut wanted = own.to_owned();
    if !wanted.is_empty() && !wanted.ends_with('\n') {
        wanted.push('\n');
    }
    wanted.push_str(DNS_MARKER);
    wanted.push('\n');
    wanted.push_str(&zone_lines(records));
    if wanted == current {
        return;
    }
    let partial = disk.join("etc/.hosts.exk8s");
    let written = std::fs::write(&partial, &wanted).and_then(|()| std::fs::rename(&partial, &path));
    if let Err(e) = written {
        tracing::warn!(path = %path.display(), error = %e, "writing a machine's DNS records");
    }
}

/// One hosts-file line per address of each record.
fn zone_lines(records: &BTreeMap<String, Vec<String>>) -> String {
    let mut lines = String::new();
    for (name, addresses) in records {
        for address in addresses {
            lines.push_str(&format!("{address} {name}\n"));
        }
    }
    lines
}

/// The DNS simulator's records as a hosts file, `dir/dns/hosts`, for a real DNS server to
/// answer from (dnsmasq's `--hostsdir` reads it again on every change): what a client outside
/// the machines — a load balancer following the control plane's name — resolves, as it would
/// ask the cloud's DNS. Written only when the records change, by a rename from outside the
/// directory, so a watcher never reads it half-written.
pub(super) fn write_zone(dir: &Path, records: &BTreeMap<String, Vec<String>>) {
    let zone = dir.join("dns");
    let path = zone.join("hosts");
    let wanted = zone_lines(records);
    if std::fs::read_to_string(&path).is_ok_and(|current| current == wanted) {
        return;
    }
    let partial = dir.join(".dns-hosts.exk8s");
    let written = std::fs::create_dir_all(&zone)
        .and_then(|()| std::fs::write(&partial, &wanted))
        .and_then(|()| std::fs::rename(&partial, &path));
    if let Err(e) = written {
        tracing::warn!(path = %path.display(), error = %e, "writing the DNS records as a hosts file");
    }
}
