//! `cargo xtask test`: everything CI checks, in the order that fails fastest: the layers
//! (imports run one way, `cargo xtask layers`), fmt, clippy, the eBPF object, a short bounded run of every fuzz target, the build, then all tests.
//!
//! The end-to-end tests load eBPF programs, create cgroups and PID namespaces: they are
//! named `privileged_*`, need root, and are part of the normal suite. As root they all
//! run; `--unprivileged` skips them explicitly (and says so), and nothing else does.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::build::{install_sim, sim_dir};
use crate::util::{cargo, exec, is_root, root, step};

#[derive(Debug, Args)]
pub struct TestArgs {
    /// Run without root: the privileged end-to-end tests are skipped (and counted as such).
    #[arg(long)]
    unprivileged: bool,

    /// Skip the fmt and clippy checks (quicker while iterating).
    #[arg(long)]
    no_lint: bool,

    /// Skip the short fuzzing run (quicker while iterating).
    #[arg(long)]
    no_fuzz: bool,
}

/// The build and the tests are compiled with line tables only (file and line in backtraces,
/// no variable or type information): the ~50 test binaries are smaller and link faster, which
/// CI's 30 minutes need. A plain `cargo build` keeps the dev profile's full debug info (and
/// rebuilds once after this).
const DEBUG_ENV: (&str, &str) = ("CARGO_PROFILE_DEV_DEBUG", "line-tables-only");

pub fn run(args: &TestArgs) -> Result<()> {
    let root_user = is_root();
    if !root_user && !args.unprivileged {
        bail!(
            "the end-to-end tests load eBPF programs and create cgroups: run as root \
             (`sudo -E cargo xtask test`), or pass --unprivileged to skip them"
        );
    }
    if !args.no_lint {
        crate::layers::run()?;
        step("cargo fmt --check");
        exec(cargo().args(["fmt", "--all", "--", "--check"]))?;
        step("cargo clippy --all-targets -D warnings");
        exec(cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))?;
    }
    crate::bpf::check()?;
    // Before the tests, so that the test tally stays the last thing printed.
    if !args.no_fuzz {
        crate::fuzz::fuzz(crate::fuzz::CI_SECONDS, false, &[])?;
    }

    step("building the workspace and the simulated driver");
    exec(
        cargo()
            .args(["build", "--workspace"])
            .env(DEBUG_ENV.0, DEBUG_ENV.1),
    )?;
    install_sim(&root().join("target").join("debug"))?;

    step("cargo test (unit, integration and privileged end-to-end tests)");
    let mut cmd = cargo();
    cmd.args(["test", "--workspace", "--no-fail-fast"])
        .env(DEBUG_ENV.0, DEBUG_ENV.1)
        .env("FGPU_SIM_DIR", sim_dir())
        .stdout(Stdio::piped());
    if args.unprivileged {
        cmd.env("FGPU_SKIP_PRIVILEGED", "1");
    }
    let mut child = cmd.spawn().context("starting cargo test")?;
    let stdout = child.stdout.take().context("cargo test's stdout")?;
    let mut tally = Tally::default();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        tally.read(&line);
    }
    let status = child.wait()?;

    println!();
    // Last, so that a log cut to its head and tail still says why each test failed.
    tally.print_failures();
    if args.unprivileged {
        println!("privileged end-to-end tests: SKIPPED (--unprivileged, not root)");
    } else {
        println!(
            "privileged end-to-end tests: {} passed, {} failed (as root)",
            tally.privileged_passed, tally.privileged_failed
        );
    }
    println!(
        "{} passed, {} failed, {} ignored",
        tally.passed, tally.failed, tally.ignored
    );
    if !status.success() || tally.failed > 0 {
        bail!("tests failed");
    }
    if root_user && !args.unprivileged && tally.privileged_passed == 0 {
        bail!("no privileged end-to-end test ran: the suite is not testing the kernel side");
    }
    Ok(())
}

/// The most lines of one failure's panic message kept for the digest.
const DIGEST_LINES: usize = 12;
/// The most characters of one line kept for the digest.
const DIGEST_WIDTH: usize = 400;

/// Counts from libtest's output, and the start of each failure's panic message.
#[derive(Debug, Default)]
struct Tally {
    passed: u64,
    failed: u64,
    ignored: u64,
    privileged_passed: u64,
    privileged_failed: u64,
    /// (test name, the lines from its `panicked at` on).
    failures: Vec<(String, Vec<String>)>,
    /// Inside a `---- NAME stdout ----` section: has its panic line been seen yet?
    in_failure: Option<bool>,
}

impl Tally {
    fn read(&mut self, line: &str) {
        if let Some(name) = line
            .strip_prefix("---- ")
            .and_then(|r| r.strip_suffix(" stdout ----"))
        {
            self.failures.push((name.to_string(), Vec::new()));
            self.in_failure = Some(false);
            return;
        }
        if let Some(panicked) = self.in_failure {
            if line == "failures:" || line.starts_with("stack backtrace:") {
                self.in_failure = None;
            } else if panicked || line.contains("panicked at") {
                self.in_failure = Some(true);
                if let Some((_, lines)) = self.failures.last_mut()
                    && lines.len() < DIGEST_LINES
                {
                    lines.push(line.chars().take(DIGEST_WIDTH).collect());
                }
            }
            return;
        }
        if let Some(rest) = line.strip_prefix("test result: ") {
            self.passed += field(rest, "passed");
            self.failed += field(rest, "failed");
            self.ignored += field(rest, "ignored");
        } else if let Some(rest) = line.strip_prefix("test ")
            && rest.contains("privileged_")
        {
            if rest.ends_with("... ok") {
                self.privileged_passed += 1;
            } else if rest.ends_with("... FAILED") {
                self.privileged_failed += 1;
            }
        }
    }
}

impl Tally {
    fn print_failures(&self) {
        if self.failures.is_empty() {
            return;
        }
        println!("why each test failed (the start of its panic message):");
        for (name, lines) in &self.failures {
            println!("  {name}");
            if lines.is_empty() {
                println!("    (no panic message: see its output above)");
            }
            for line in lines {
                println!("    {line}");
            }
        }
        println!();
    }
}

/// The number before `name` in `ok. 3 passed; 0 failed; 1 ignored; ...`.
fn field(summary: &str, name: &str) -> u64 {
    summary
        .split([';', '.'])
        .filter_map(|part| part.trim().strip_suffix(name))
        .find_map(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tallies_libtest_output() {
        let mut t = Tally::default();
        t.read("test privileged_status_counts_bytes ... ok");
        t.read("test privileged_exit_releases ... FAILED");
        t.read("test quantity::tests::sizes ... ok");
        t.read("test result: ok. 12 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out");
        t.read("test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured");
        assert_eq!((t.passed, t.failed, t.ignored), (13, 1, 2));
        assert_eq!((t.privileged_passed, t.privileged_failed), (1, 1));
    }

    #[test]
    fn keeps_the_start_of_each_panic_message() {
        let mut t = Tally::default();
        for line in [
            "failures:",
            "",
            "---- privileged_share_holds stdout ----",
            "HIP cap 50%: 49.9%",
            "",
            "thread 'privileged_share_holds' (42) panicked at shim/tests/x.rs:9:5:",
            "share 41.0%",
            "stack backtrace:",
            "   0: __rustc::rust_begin_unwind",
            "---- other stdout ----",
            "no panic line here",
            "",
            "failures:",
            "    privileged_share_holds",
        ] {
            t.read(line);
        }
        let digest: Vec<_> = t
            .failures
            .iter()
            .map(|(n, l)| (n.as_str(), l.len()))
            .collect();
        assert_eq!(digest, [("privileged_share_holds", 2), ("other", 0)]);
        assert_eq!(t.failures[0].1[1], "share 41.0%");
        // A long message is cut, and counting goes on after the sections.
        t.read("---- long stdout ----");
        t.read("thread 'long' panicked at a.rs:1:1:");
        for _ in 0..50 {
            t.read(&"x".repeat(1000));
        }
        t.read("failures:");
        assert_eq!(t.failures[2].1.len(), DIGEST_LINES);
        assert_eq!(t.failures[2].1[1].len(), DIGEST_WIDTH);
        t.read("test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured");
        assert_eq!(t.passed, 2);
    }
}
