//! Where a long test's minutes go, shown while it runs: [`begin`] names the test on this thread
//! and [`mark`] writes one line per phase — the time of day and the seconds since the test
//! began — straight to the process's stderr. libtest captures only the `print!` family, so these
//! lines reach a run's log as they happen even for a test that passes, and a slow CI run can be
//! read phase by phase instead of guessed at.

use std::cell::RefCell;
use std::io::Write;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

thread_local! {
    static CURRENT: RefCell<Option<(String, Instant)>> = const { RefCell::new(None) };
}

/// The test running on this thread, until the guard drops (which marks how it ended).
#[must_use = "the timeline ends when this guard drops"]
pub struct Timeline(());

/// Starts the timeline of `test` on this thread.
pub fn begin(test: &str) -> Timeline {
    CURRENT.with(|c| *c.borrow_mut() = Some((test.to_owned(), Instant::now())));
    mark("begins");
    Timeline(())
}

/// Marks that this thread's test reached `phase` (nothing when no timeline was begun here).
pub fn mark(phase: &str) {
    CURRENT.with(|c| {
        if let Some((test, start)) = c.borrow().as_ref() {
            write_line(test, start.elapsed().as_secs(), phase);
        }
    });
}

impl Drop for Timeline {
    fn drop(&mut self) {
        mark(if std::thread::panicking() {
            "failed"
        } else {
            "ends"
        });
        CURRENT.with(|c| c.borrow_mut().take());
    }
}

fn write_line(test: &str, seconds: u64, phase: &str) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (h, m, s) = (now / 3600 % 24, now / 60 % 60, now % 60);
    // A lost progress line is no reason to fail a test.
    let _ = writeln!(
        std::io::stderr().lock(),
        "==> [{h:02}:{m:02}:{s:02}] {test} +{seconds}s: {phase}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_belong_to_the_thread_that_began_them() {
        assert!(CURRENT.with(|c| c.borrow().is_none()));
        {
            let _timeline = begin("timeline's own unit test");
            assert_eq!(
                CURRENT.with(|c| c.borrow().as_ref().map(|(t, _)| t.clone())),
                Some("timeline's own unit test".to_owned())
            );
            std::thread::spawn(|| assert!(CURRENT.with(|c| c.borrow().is_none())))
                .join()
                .unwrap();
        }
        assert!(CURRENT.with(|c| c.borrow().is_none()), "the guard ends it");
    }
}
