//! What a booted machine's console says about its power-off: systemd prints a progress line
//! for every stop job it has waited on for a few seconds (`Job etcd.service/stop running (6s /
//! 1min 30s)`, long unit names cut short, wrapped in terminal colour codes). [`stop_waits`]
//! reads each wait's length from it, so a test can tell a unit held toward its stop timeout
//! from one that merely took a few seconds to end.

use std::time::Duration;

/// Every stop wait the console shows, as `(how long systemd had waited, the job's line)`: the
/// line is the text from `Job` on. A line whose times are not systemd's time spans is an error
/// that quotes it, never a wait of zero.
pub fn stop_waits(console: &str) -> Result<Vec<(Duration, &str)>, String> {
    let mut waits = Vec::new();
    for line in console.lines().filter(|l| l.contains("/stop running (")) {
        let job = line.find("Job ").map_or(line, |at| &line[at..]);
        let times = job
            .rsplit_once('(')
            .and_then(|(_, rest)| rest.split_once(')'))
            .and_then(|(times, _)| times.split_once(" / "))
            .ok_or_else(|| format!("a stop job's line without its times: {job:?}"))?;
        let waited = humantime::parse_duration(times.0)
            .map_err(|e| format!("a stop job's time {:?} in {job:?}: {e}", times.0))?;
        waits.push((waited, job));
    }
    Ok(waits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_wait_from_systemds_progress_lines() {
        let console = "Stopping etcd.service...\n\
            \x1b[K[\x1b[0;1;31m*\x1b[0m\x1b[0;31m*    \x1b[0m] Job etcd.service/stop running (6s / 1min 30s)\n\
            [  OK  ] Stopped etcd.service.\n\
            [ ***] Job cri-containerd-0123…/stop running (1min 6s / 1min 30s)\n";
        let waits = stop_waits(console).unwrap();
        assert_eq!(
            waits,
            vec![
                (
                    Duration::from_secs(6),
                    "Job etcd.service/stop running (6s / 1min 30s)"
                ),
                (
                    Duration::from_secs(66),
                    "Job cri-containerd-0123…/stop running (1min 6s / 1min 30s)"
                ),
            ]
        );
        assert_eq!(
            stop_waits("[  OK  ] Reached target poweroff.target.\n"),
            Ok(vec![])
        );
    }

    #[test]
    fn a_line_it_cannot_read_is_an_error_that_quotes_it() {
        let err =
            stop_waits("[ ***] Job etcd.service/stop running (soon / 1min 30s)\n").unwrap_err();
        assert!(err.contains("\"soon\""), "{err}");
        let err = stop_waits("[ ***] Job etcd.service/stop running (6s\n").unwrap_err();
        assert!(err.contains("without its times"), "{err}");
    }
}
