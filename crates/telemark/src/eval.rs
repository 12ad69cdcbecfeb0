//! `telemark eval`: placeholder wired below.
use anyhow::Result;
use clap::Args as ClapArgs;

/// `telemark eval` flags.
#[derive(ClapArgs, Debug)]
pub struct Args {}

/// Runs `telemark eval`.
pub fn run(_a: Args) -> Result<()> {
    anyhow::bail!("not yet")
}
