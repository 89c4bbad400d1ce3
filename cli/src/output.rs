//! How answers are shown: a table for people (`-o table`, the default), or the API's own
//! JSON (`-o json`) or YAML (`-o yaml`) for scripts.

use std::io::Write as _;

use comfy_table::{ContentArrangement, Table, presets::NOTHING};
use serde::Serialize;

use crate::error::CliError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    Table,
    Json,
    Yaml,
}

/// Writes `text` and a newline to stdout.
pub(crate) fn line(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}").map_err(|e| CliError::io("writing to stdout", e))
}

/// Shows `value` as JSON or YAML, or as `table` renders it.
pub(crate) fn show<T: Serialize + ?Sized>(
    format: Format,
    value: &T,
    table: impl FnOnce(&T) -> Table,
) -> Result<(), CliError> {
    line(&render(format, value, table)?)
}

/// `value` as JSON or YAML, or as `table` renders it.
pub(crate) fn render<T: Serialize + ?Sized>(
    format: Format,
    value: &T,
    table: impl FnOnce(&T) -> Table,
) -> Result<String, CliError> {
    Ok(match format {
        Format::Json => serde_json::to_string_pretty(value)
            .map_err(|e| CliError::Unexpected(format!("re-encoding JSON: {e}")))?,
        Format::Yaml => yaml_serde::to_string(value)
            .map_err(|e| CliError::Unexpected(format!("encoding YAML: {e}")))?
            .trim_end()
            .to_owned(),
        Format::Table => {
            let mut table = table(value);
            for column in table.column_iter_mut() {
                column.set_padding((0, 3));
            }
            table
                .to_string()
                .lines()
                .map(str::trim_end)
                .collect::<Vec<_>>()
                .join("\n")
        }
    })
}

/// A borderless table with `header`, columns three spaces apart (as kubectl's).
pub(crate) fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table
        .load_preset(NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.iter().map(|h| h.to_uppercase()));
    table
}

/// An optional value as a cell ("-" when absent).
pub(crate) fn cell<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

/// How long ago `then` (unix seconds) was, like kubectl's AGE column.
pub(crate) fn age(then: i64, now: i64) -> String {
    let secs = (now - then).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// The UTC day of a unix time, `YYYY-MM-DD`.
pub(crate) fn date(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .map_or_else(|_| "-".into(), |t| t.date().to_string())
}

pub(crate) fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
