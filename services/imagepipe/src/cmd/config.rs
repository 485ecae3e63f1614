//! `imagepipe config print`.

use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use imagepipe_runtime::ConfigArgs;

/// What to do with the configuration.
#[derive(Debug, Subcommand)]
pub enum ConfigAction {
    /// Print the effective configuration (defaults < file < environment) as TOML, secrets masked.
    Print {
        /// Print it as one JSON object instead (the same keys and values, secrets masked).
        #[arg(long)]
        json: bool,
    },
}

/// Runs `imagepipe config ACTION`.
pub fn run(config: &ConfigArgs, action: ConfigAction) -> anyhow::Result<ExitCode> {
    match action {
        ConfigAction::Print { json } => {
            let settings = config.load().context("loading the configuration")?;
            if json {
                super::print_json(&settings.to_masked_json().context("printing the configuration")?)?;
            } else {
                out!("{}", settings.to_masked_toml().context("printing the configuration")?);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
