//! `--watch` on a cluster's lists (`nodes`, `certs`, `node-pools list`, `snapshots list`): the list,
//! then the list again each time it changes, as `kubectl get --watch` does. The cluster's event
//! stream (`GET /clusters/{id}/events`) says when something happened — a node added, a report,
//! a node removed, a snapshot asked for or ended, an upgrade's step — and its keep-alive comes
//! every 15 seconds; at each, the list is read again and shown when it differs (so a change the
//! stream carries no event for shows within 15 seconds): tables a blank line apart, JSON documents one after the other,
//! YAML documents after `---`. It runs until interrupted, the stream reopened after its last
//! event whenever it ends. `--wait` on a snapshot or a restore follows the same stream
//! ([`until`]).

use std::time::Duration;

use crate::client::Api;
use crate::error::CliError;
use crate::output::{Format, line};

/// Times in a row the stream may fail to open before the watch gives up.
const REOPENS: u32 = 5;

/// Opens the cluster's event stream after `last`, retrying while it is out of reach (at most
/// [`REOPENS`] times in a row).
fn open(
    api: &Api,
    cluster: i64,
    last: Option<i64>,
) -> Result<crate::sse::Events<std::io::BufReader<Box<dyn std::io::Read + Send + Sync>>>, CliError>
{
    let path = format!("/clusters/{cluster}/events");
    let mut failures = 0;
    loop {
        match api.events(&path, last) {
            Ok(body) => return Ok(crate::sse::Events::new(std::io::BufReader::new(body))),
            Err(e @ CliError::Unreachable { .. }) if failures < REOPENS => {
                failures += 1;
                eprintln!("the event stream is out of reach ({e}); retrying");
                std::thread::sleep(Duration::from_secs(2));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Shows `render`'s list of cluster `cluster`, then again each time it changes.
pub(crate) fn changes(
    api: &Api,
    cluster: i64,
    format: Format,
    mut render: impl FnMut() -> Result<String, CliError>,
) -> Result<(), CliError> {
    let mut shown = render()?;
    line(&shown)?;
    let mut last: Option<i64> = None;
    loop {
        // Every block ends a wait: an event, or the keep-alive that comes every 15 seconds.
        let mut events = open(api, cluster, last)?;
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

/// Follows cluster `cluster`'s event stream — from its start, so what happened before it
/// opened counts; resumed after its last event whenever it ends — handing `seen` each event
/// (`None` for a keep-alive, which comes every 15 seconds) until it returns a value. Past
/// `timeout`, looked at on each, `late` decides. The cluster deleted ends it with an error.
pub(crate) fn until<T>(
    api: &Api,
    cluster: i64,
    timeout: Duration,
    mut seen: impl FnMut(Option<&crate::sse::Event>) -> Result<Option<T>, CliError>,
    late: impl FnOnce() -> Result<T, CliError>,
) -> Result<T, CliError> {
    let start = std::time::Instant::now();
    let mut last: Option<i64> = None;
    loop {
        let mut events = open(api, cluster, last)?;
        while let Some(Ok(block)) = events.next() {
            last = events.last_id().parse().ok().or(last);
            let event = match &block {
                crate::sse::Block::Event(event) if event.kind == "deleted" => {
                    return Err(CliError::Failed(format!("cluster {cluster} was deleted")));
                }
                crate::sse::Block::Event(event) => Some(event),
                crate::sse::Block::Empty => None,
            };
            if let Some(done) = seen(event)? {
                return Ok(done);
            }
            if start.elapsed() > timeout {
                return late();
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}
