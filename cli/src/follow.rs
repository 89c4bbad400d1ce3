//! `--watch` on a cluster's lists (`nodes`, `certs`, `node-pools list`, `snapshots list`): the list,
//! then the list again each time it changes, as `kubectl get --watch` does. The cluster's event
//! stream (`GET /clusters/{id}/events`) says when something happened — a node added, a report,
//! a snapshot asked for or ended — and its keep-alive comes every 15 seconds; at each, the list
//! is read again and shown when it differs (so a change the stream carries no event for, a node
//! removed, shows within 15 seconds): tables a blank line apart, JSON documents one after the other,
//! YAML documents after `---`. It runs until interrupted, the stream reopened after its last
//! event whenever it ends.

use std::time::Duration;

use crate::client::Api;
use crate::error::CliError;
use crate::output::{Format, line};

/// Times in a row the stream may fail to open before the watch gives up.
const REOPENS: u32 = 5;

/// Shows `render`'s list of cluster `cluster`, then again each time it changes.
pub(crate) fn changes(
    api: &Api,
    cluster: i64,
    format: Format,
    mut render: impl FnMut() -> Result<String, CliError>,
) -> Result<(), CliError> {
    let mut shown = render()?;
    line(&shown)?;
    let path = format!("/clusters/{cluster}/events");
    let mut last: Option<i64> = None;
    let mut failures = 0;
    loop {
        let body = match api.events(&path, last) {
            Ok(body) => body,
            Err(e @ CliError::Unreachable { .. }) if failures < REOPENS => {
                failures += 1;
                eprintln!("the event stream is out of reach ({e}); retrying");
                std::thread::sleep(Duration::from_secs(2));
                continue;
            }
            Err(e) => return Err(e),
        };
        failures = 0;
        // Every block ends a wait: an event, or the keep-alive that comes every 15 seconds.
        let mut events = crate::sse::Events::new(std::io::BufReader::new(body));
        while let Some(Ok(_)) = events.next() {
            last = events.last_id().parse().ok().or(last);
            let now = render()?;
            if now != shown {
                match format {
                    Format::Table => line("")?,
                    Format::Yaml => line("---")?,
                    Format::Json => {}
                }
                line(&now)?;
                shown = now;
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}
