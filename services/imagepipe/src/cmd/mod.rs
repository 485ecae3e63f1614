//! One module per command, and what several commands share.

#[macro_use]
pub mod output;
pub mod bench;
pub mod cancel;
pub mod cluster;
pub mod config;
pub mod demo;
pub mod dlq;
pub mod doctor;
pub mod found;
pub mod healthcheck;
pub mod history;
pub mod list;
pub mod pause;
pub mod queues;
pub mod reprocess;
pub mod run;
pub mod search;
pub mod show;
pub mod similar;
pub mod stats;
pub mod status;
pub mod submit;
pub mod thumbnail;
pub mod watch;

/// Prints a borderless table (`presets::NOTHING`) without the space before its first column and
/// the spaces after its last.
pub fn print_table(table: &comfy_table::Table) {
    for line in table.lines() {
        outln!("{}", line.strip_prefix(' ').unwrap_or(&line).trim_end());
    }
}

/// Prints `value` as pretty JSON on stdout.
pub fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// A `--label key=value` argument.
pub fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).ok_or_else(|| format!("{s:?} is not key=value"))
}
