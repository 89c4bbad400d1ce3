//! The members a node's bundle lists for its balancer: one `IP:PORT` per line (blank lines
//! and `#` comments aside), the apiservers until the control plane's name first resolves.

use std::net::SocketAddr;
use std::path::Path;

/// The addresses `file` lists, each once, in order; what is wrong with it otherwise.
pub(super) fn read(file: &Path) -> Result<Vec<SocketAddr>, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", file.display()))
}

fn parse(text: &str) -> Result<Vec<SocketAddr>, String> {
    let mut addrs = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let addr: SocketAddr = line
            .parse()
            .map_err(|_| format!("line {}: {line:?} is not IP:PORT", number + 1))?;
        if !addrs.contains(&addr) {
            addrs.push(addr);
        }
    }
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test")]

    use super::parse;

    #[test]
    fn a_list_is_addresses_and_ports_one_a_line() {
        let text = "# the members\n10.0.0.11:6443\n\n[fd00::12]:6443\n10.0.0.11:6443\n";
        let addrs = parse(text).unwrap();
        let shown: Vec<String> = addrs.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["10.0.0.11:6443", "[fd00::12]:6443"]);
        assert_eq!(parse("").unwrap(), []);
        let bad = parse("10.0.0.11:6443\ncp.example.com:6443\n").unwrap_err();
        assert_eq!(bad, "line 2: \"cp.example.com:6443\" is not IP:PORT");
        assert!(parse("10.0.0.11\n").is_err(), "a port is needed");
    }
}
