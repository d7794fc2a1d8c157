//! `sparta config show`: the job a config (or a built-in format) means, written out in full,
//! with the `[[tables]]` and `[[features]]` a job without them implies.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use sparta_core::config::Format;
use sparta_core::JobConfig;

/// `sparta config ...`.
#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Print the full job config: every default, and the explicit tables and features.
    Show(ShowArgs),
}

/// Flags of `sparta config show`.
#[derive(Args, Debug)]
pub struct ShowArgs {
    /// Job config to start from (default: the built-in defaults).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Built-in input format: criteo or avazu (overrides the config's `data.format`).
    #[arg(long)]
    pub format: Option<String>,
    /// Model: wdl, deepfm, dcn, dcnv2, dlrm, din, mmoe or esmm (decides which features get first-order weights).
    #[arg(long)]
    pub model: Option<String>,
}

/// Runs `sparta config ...`.
pub fn run(c: ConfigCommand) -> Result<()> {
    match c {
        ConfigCommand::Show(a) => show(a),
    }
}

fn show(a: ShowArgs) -> Result<()> {
    let (mut cfg, source) = match &a.config {
        Some(p) => (JobConfig::from_file(p)?, p.display().to_string()),
        None => (JobConfig::default(), "the built-in defaults".to_string()),
    };
    if let Some(f) = &a.format {
        cfg.data.format = match f.as_str() {
            "criteo" => Format::Criteo,
            "avazu" => Format::Avazu,
            other => anyhow::bail!("--format {other:?}: expected criteo or avazu"),
        };
    }
    if let Some(m) = &a.model {
        cfg.model.kind =
            serde_json::from_value(serde_json::Value::String(m.clone())).map_err(|_| {
                anyhow::anyhow!(
                    "--model {m:?}: expected wdl, deepfm, dcn, dcnv2, dlrm, din, mmoe or esmm"
                )
            })?;
    }
    // The user's job first: an invalid field is their config's error, named as such.
    cfg.validate()
        .map_err(|e| anyhow::anyhow!("invalid job config ({source}): {e}"))?;
    cfg.make_features_explicit()?;
    // The printed text must mean the job it came from.
    let exact = toml::to_string(&cfg).context("writing the config as TOML")?;
    JobConfig::from_toml(&exact)?
        .validate()
        .context("the printed config does not validate (a bug)")?;
    print!("{}", shortest_floats(&exact));
    Ok(())
}

/// `text` (TOML as written by `toml::to_string`) with every float that is exactly an `f32`
/// written as the shortest decimal that reads back as that `f32` (`lr = 0.001`, not the
/// `f64` expansion `0.0010000000474974513` of the stored `f32`). The result must mean the
/// same job: when reading it back does not give `text` again (a float of an `f64` field that
/// happens to be an exact `f32`), `text` is returned unchanged.
fn shortest_floats(text: &str) -> String {
    let short = rewrite_floats(text);
    let same = JobConfig::from_toml(&short)
        .ok()
        .and_then(|c| toml::to_string(&c).ok())
        .is_some_and(|again| again == text);
    if same {
        short
    } else {
        text.to_string()
    }
}

/// Rewrites each float literal outside strings and comments whose value is exactly an `f32`.
fn rewrite_floats(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.char_indices().peekable();
    let mut prev = '\n';
    while let Some((i, c)) = chars.next() {
        match c {
            '"' | '\'' => {
                out.push(c);
                let mut escaped = false;
                for (_, s) in chars.by_ref() {
                    out.push(s);
                    if c == '"' && !escaped && s == '\\' {
                        escaped = true;
                        continue;
                    }
                    if s == c && !escaped {
                        break;
                    }
                    escaped = false;
                }
                prev = c;
                continue;
            }
            '#' => {
                out.push(c);
                for (_, s) in chars.by_ref() {
                    out.push(s);
                    if s == '\n' {
                        break;
                    }
                }
                prev = '\n';
                continue;
            }
            _ => {}
        }
        let starts_value = (c.is_ascii_digit() || c == '-' || c == '+')
            && matches!(prev, ' ' | '=' | '[' | ',' | '{' | '\n');
        if !starts_value {
            out.push(c);
            prev = c;
            continue;
        }
        let mut end = i + c.len_utf8();
        while let Some(&(j, d)) = chars.peek() {
            if d.is_ascii_alphanumeric() || matches!(d, '.' | '-' | '+' | '_') {
                end = j + d.len_utf8();
                chars.next();
            } else {
                break;
            }
        }
        let token = &text[i..end];
        out.push_str(&shorten(token).unwrap_or_else(|| token.to_string()));
        prev = token.chars().last().unwrap_or(c);
    }
    out
}

/// The shortest form of one float literal that is exactly an `f32`; `None` to keep it.
fn shorten(token: &str) -> Option<String> {
    if !token.contains(['.', 'e', 'E']) {
        return None;
    }
    let v: f64 = token.parse().ok()?;
    let f = v as f32;
    if !v.is_finite() || f64::from(f) != v {
        return None;
    }
    let s = format!("{f:?}");
    // `{:?}` of an f32 is its shortest round-trip form (`0.001`, `1e-8`, `1.0`).
    Some(s)
}
