//! End-to-end: `fgpu top` against a real agent on the simulated driver: `--once` for
//! scripts, and the live view in a real terminal (tmux: capture-pane to read it, send-keys
//! to quit), refreshing when a limit changes.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Agent, Cgroup, Load, SimState, ok, privileged, unique};

/// A tmux server of the test's own (`-L`), killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn new() -> Self {
        let found = Command::new("tmux").arg("-V").output();
        assert!(
            found.is_ok_and(|o| o.status.success()),
            "tmux is needed (Debian: apt-get install tmux; .ci/run installs it)"
        );
        Tmux {
            socket: unique("fgpu-top"),
        }
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .output()
            .expect("running tmux")
    }

    /// The pane as it shows now.
    fn capture(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    /// Waits until the pane shows a line that `pred` accepts; returns that line.
    fn wait_line(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let screen = self.capture();
            if let Some(l) = screen.lines().find(|l| pred(l)) {
                return l.to_string();
            }
            assert!(
                Instant::now() < deadline,
                "the live view never showed {what}:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

#[test]
fn privileged_top_once_and_the_live_view_in_tmux() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let state = SimState::new();
    let cg = Cgroup::new(&unique("fgpu-e2e-top"));
    ok(&agent.cli(&[
        "limit",
        "set",
        &cg.path,
        "--memory",
        "1GiB",
        "--compute",
        "30",
    ]));
    // 300 MiB context overhead + 212 MiB = 512 MiB of the 1 GiB, then 1 GiB more: refused.
    let load = Load::spawn_with_shim(
        &cg,
        &state.0,
        &agent,
        &["alloc", "212MiB", "alloc", "1GiB", "hold"],
    );
    let mut load = load;
    load.expect_line("ready");
    agent.wait_for(&cg, "the denial", Duration::from_secs(5), |s| {
        s.is_some_and(|s| s["alloc_denied"] == 1)
    });

    // --once: one plain frame, no escape sequences.
    let once = ok(&agent.cli(&["top", "--once"]));
    assert!(!once.contains('\x1b'), "{once:?}");
    let lines: Vec<&str> = once.lines().collect();
    assert!(
        lines[0].contains("1 cgroups using a GPU, 1 with a memory limit, 1 allocations denied"),
        "{once}"
    );
    let row = lines
        .iter()
        .find(|l| l.starts_with(&format!("{} ", cg.path)))
        .unwrap_or_else(|| panic!("no row for {}:\n{once}", cg.path));
    // The kernel saw 212 MiB allocated by the process (the context overhead is the shim's).
    assert!(row.contains("212MiB") && row.contains("1GiB"), "{row}");
    assert!(
        row.contains("[####................]  21%"),
        "212 MiB of 1 GiB: {row}"
    );
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[cols.len() - 5], "1", "DENIED: {row}");
    assert_eq!(cols[cols.len() - 4], "30%", "SHARE: {row}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("kernel: 0 events dropped")),
        "{once}"
    );
    let bad = agent.cli(&["top", "--interval", "0"]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("--interval 0"),
        "{bad:?}"
    );

    // The live view in a terminal: it shows the row, follows a limit change, quits on `q`.
    let tmux = Tmux::new();
    let top = format!(
        "{} top --interval 0.2 --socket {}",
        env!("CARGO_BIN_EXE_fgpu"),
        agent.admin.display()
    );
    let started = tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "160",
        "-y",
        "30",
        &top,
    ]);
    assert!(started.status.success(), "{started:?}");
    let first = tmux.wait_line("the container's row", |l| {
        l.starts_with(&format!("{} ", cg.path))
    });
    assert!(
        first.contains("[####................]  21%") && first.contains("1GiB"),
        "{first}"
    );
    assert!(tmux.capture().contains("every 0.2s, q quits"));
    ok(&agent.cli(&["limit", "set", &cg.path, "--memory", "2GiB"]));
    let after = tmux.wait_line("the new limit", |l| {
        l.starts_with(&format!("{} ", cg.path)) && l.contains("2GiB")
    });
    assert!(
        after.contains("[##..................]  10%"),
        "212 MiB of 2 GiB: {after}"
    );
    assert!(tmux.run(&["send-keys", "-t", "top", "q"]).status.success());
    let deadline = Instant::now() + Duration::from_secs(5);
    while tmux.run(&["has-session", "-t", "top"]).status.success() {
        assert!(
            Instant::now() < deadline,
            "q did not quit:\n{}",
            tmux.capture()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(load.finish().success());
}
