//! `imagepipe config print`.

use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use imagepipe_runtime::ConfigArgs;

/// What to do with the configuration.
#[derive(Debug, Subcommand)]
pub enum ConfigAction {
    /// Print the effective configuration (defaults < file < environment) as TOML, secrets masked.
    Print,
}

/// Runs `imagepipe config ACTION`.
pub fn run(config: &ConfigArgs, action: ConfigAction) -> anyhow::Result<ExitCode> {
    match action {
        ConfigAction::Print => {
            let settings = config.load().context("loading the configuration")?;
            out!("{}", settings.to_masked_toml().context("printing the configuration")?);
            Ok(ExitCode::SUCCESS)
        }
    }
}
