//! `fgpu generate` (hidden): shell completions (bash, zsh, fish) and man pages, generated from
//! the command line's own clap definition, so that they can never disagree with `--help`.
//! The images run it at build time with the binary they just built (deploy/images/
//! build.Dockerfile), and `cargo xtask dist-docs` runs it into target/dist/.
//!
//! Why a hidden command of the binary: `Cli` is private to the binary, and its arguments are
//! types spread over every module (agent, cdi, k8s, cli); xtask cannot import it, and turning
//! the crate into a library just to export it would reshape the whole layout. Generating
//! needs nothing but `Cli::command()`, which is already here, and clap_complete and
//! clap_mangen are small, so the binary carries the generator itself and everyone who needs
//! the files (xtask, the image build, a packager) runs it.
//!
//! Why `generate` is not a variant of `enum Command` (with `hide = true`): clap_complete
//! completes hidden subcommands too (only clap_mangen skips them), so `fgpu g<TAB>` would
//! offer it and the scripts would carry its options. [`parse`] adds it to the command line
//! beside `Cli` instead, and the files are generated from `Cli::command()`: exactly the
//! public interface.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use clap_complete::Shell;

/// The hidden subcommand's name: `fgpu generate ...`.
const NAME: &str = "generate";

/// Generate shell completions and man pages from fgpu's clap definition (for packagers: the
/// images and `cargo xtask dist-docs` run it).
#[derive(Debug, Parser)]
#[command(name = NAME, hide = true)]
pub struct GenerateArgs {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// A shell's completion script: to stdout, or (--out) into DIR as fgpu.bash, _fgpu, fgpu.fish.
    ///
    ///   fgpu generate completions bash > /usr/share/bash-completion/completions/fgpu
    ///   fgpu generate completions zsh > /usr/share/zsh/vendor-completions/_fgpu
    ///   fgpu generate completions fish > /usr/share/fish/vendor_completions.d/fgpu.fish
    #[command(verbatim_doc_comment)]
    Completions {
        /// The shell to complete for.
        shell: Shell,
        /// Write the script into this directory (created if missing) instead of to stdout.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Man pages (section 1): fgpu.1 and one page per subcommand, nested ones too
    /// (fgpu-limit.1, fgpu-limit-set.1, ...), written into DIR (created if missing).
    Man {
        /// The directory to write the pages into, e.g. /usr/share/man/man1.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

/// Parses the command line as `Cli::parse()` would, with the hidden `fgpu generate` beside
/// `Cli`'s subcommands. `fgpu generate ...` is run here, and the process exits with its
/// status; anything else is returned as `Cli`.
pub fn parse() -> crate::Cli {
    let mut cmd = crate::Cli::command().subcommand(GenerateArgs::command());
    let matches = cmd.get_matches_mut();
    if let Some((NAME, sub)) = matches.subcommand() {
        let args =
            GenerateArgs::from_arg_matches(sub).unwrap_or_else(|e| e.format(&mut cmd).exit());
        let code = match run(&args) {
            Ok(()) => 0,
            Err(err) => {
                eprintln!("fgpu: error: {err:#}");
                1
            }
        };
        std::process::exit(code);
    }
    crate::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut cmd).exit())
}

/// The command line the files describe: `Cli`, without `generate`.
fn public() -> clap::Command {
    crate::Cli::command()
}

fn run(args: &GenerateArgs) -> Result<()> {
    match &args.what {
        What::Completions { shell, out: None } => {
            // Into memory first: clap_complete panics on a write error (a closed pipe).
            let mut script = Vec::new();
            clap_complete::generate(*shell, &mut public(), "fgpu", &mut script);
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(&script)
                .and_then(|()| stdout.flush())
                .context("writing to stdout")
        }
        What::Completions {
            shell,
            out: Some(dir),
        } => {
            create_dir(dir)?;
            let path = clap_complete::generate_to(*shell, &mut public(), "fgpu", dir)
                .with_context(|| {
                    format!("writing the {shell} completions into {}", dir.display())
                })?;
            println!("{}", path.display());
            Ok(())
        }
        What::Man { out } => {
            create_dir(out)?;
            // No pages for `fgpu help` and `fgpu limit help`: every page says what `help` would.
            let mut cmd = public().disable_help_subcommand(true);
            // Names every subcommand `fgpu-limit-set` and so on: the pages' titles and files.
            cmd.build();
            let version = cmd.get_version().unwrap_or_default().to_string();
            man_pages(&cmd, &version, out)
        }
    }
}

fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// Writes `cmd`'s page and those of its visible subcommands, depth first, printing each path.
/// (clap_mangen's own `generate_to` would title them in lower case and give subcommands no
/// version; man pages are titled in capitals, `.TH FGPU-LIMIT 1`.)
fn man_pages(cmd: &clap::Command, version: &str, dir: &Path) -> Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        man_pages(sub, version, dir)?;
    }
    let name = cmd.get_display_name().unwrap_or_else(|| cmd.get_name());
    let man = clap_mangen::Man::new(cmd.clone())
        .title(name.to_uppercase())
        .source(format!("fgpu {version}"))
        .manual("fgpu manual");
    let path = dir.join(man.get_filename());
    let mut page = Vec::new();
    man.render(&mut page)?;
    std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
    println!("{}", path.display());
    Ok(())
}
