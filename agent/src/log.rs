//! Logging to stderr, one line per event, no colour and no timestamps (journald adds them
//! under systemd). Secrets never reach these functions: callers log names, paths and digests.

use std::io::Write as _;

/// Writes one log line.
pub(crate) fn emit(level: &str, message: std::fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "exk8s-agent: {level}: {message}");
}

macro_rules! log_info {
    ($($arg:tt)*) => { $crate::log::emit("info", format_args!($($arg)*)) };
}
macro_rules! log_warn {
    ($($arg:tt)*) => { $crate::log::emit("warning", format_args!($($arg)*)) };
}
macro_rules! log_error {
    ($($arg:tt)*) => { $crate::log::emit("error", format_args!($($arg)*)) };
}
pub(crate) use {log_error, log_info, log_warn};
