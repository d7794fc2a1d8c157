//! `sparta --dry-run <command> ...`: the command line parsed (clap has refused a flag the
//! command does not take, a missing or unreadable value by then) and the job config it names
//! (`--config`) read and validated when the file exists; it prints what would run and starts
//! nothing. What `scripts/check-k8s.sh` runs every container's command line of the
//! Kubernetes manifests with.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::Result;
use clap::ArgMatches;
use sparta_core::JobConfig;

/// Prints what `matches` (this process's command line) would run and what its `--config`
/// holds; an invalid config is the error.
pub fn report(matches: &ArgMatches) -> Result<()> {
    let mut m = matches;
    while let Some((_, sub)) = m.subcommand() {
        m = sub;
    }
    let line = command_line(std::env::args_os().skip(1));
    println!("dry run: sparta {line}");
    // Every command's `--config` is a path; one without the flag has no job config.
    match m.try_get_one::<PathBuf>("config").ok().flatten() {
        Some(p) if p.exists() => {
            let job = JobConfig::from_file(p)?.validate()?;
            println!(
                "config {}: valid ({:?} model, {} table(s))",
                p.display(),
                job.model.kind,
                job.features.physical.len()
            );
        }
        Some(p) => println!("config {}: not found here, not read", p.display()),
        None => println!("no --config"),
    }
    println!("nothing started");
    Ok(())
}

/// The arguments less `--dry-run`, those holding a space or a quote in single quotes.
fn command_line(args: impl Iterator<Item = OsString>) -> String {
    args.map(|a| a.to_string_lossy().into_owned())
        .filter(|a| a != "--dry-run")
        .map(|a| match a.contains([' ', '"', '\'']) || a.is_empty() {
            true => format!("'{}'", a.replace('\'', r"'\''")),
            false => a,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_drops_the_flag_and_quotes_what_a_shell_would_split() {
        let args = [
            "ps",
            "--dry-run",
            "--shard",
            "0",
            "--peers",
            "a b",
            "it's",
            "",
        ];
        let line = command_line(args.iter().map(OsString::from));
        assert_eq!(line, r"ps --shard 0 --peers 'a b' 'it'\''s' ''");
    }
}
