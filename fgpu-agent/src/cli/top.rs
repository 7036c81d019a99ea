//! `fgpu top`: a live view of the node's containers (one row per cgroup that uses a GPU):
//! memory used against the limit as a bar, compute share against the GPU time used, and
//! denials. Plain ANSI (the alternate screen, cursor home, erase), so it works over ssh and
//! in tmux; `q` or Ctrl-C quits. `--once` prints one plain frame for scripts.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::Args;
use fgpu_common::proto::Kind;
use fgpu_common::quantity::Size;

use crate::status::{CgroupStatus, StatusReport};

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Print one frame (no colours, no screen control) and exit: for scripts and logs.
    #[arg(long)]
    once: bool,

    /// Seconds between refreshes (0.1 to 3600).
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    interval: f64,

    /// The agent socket to ask [default: as `fgpu status`: $FGPU_ADMIN_SOCKET, else the admin
    /// socket, else (inside a container) the containers' socket, which shows the caller's own
    /// cgroup only].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
}

pub fn run(args: &TopArgs) -> Result<()> {
    if !(0.1..=3600.0).contains(&args.interval) {
        bail!(
            "--interval {}: give a number of seconds from 0.1 to 3600",
            args.interval
        );
    }
    let socket = crate::socket_path(args.socket.clone());
    if args.once {
        print!("{}", frame(&fetch(&socket)?, None, usize::MAX));
        return Ok(());
    }
    let interval = Duration::from_secs_f64(args.interval);
    let term = Terminal::enter();
    let mut out = std::io::stdout();
    let result = loop {
        let (report, error) = match fetch(&socket) {
            Ok(r) => (r, None),
            // The agent restarting is no reason to leave: say so and keep trying.
            Err(err) => (StatusReport::default(), Some(format!("{err:#}"))),
        };
        let (cols, rows) = term_size();
        let mut text = frame(&report, Some(interval), cols);
        if let Some(e) = error {
            let _ = writeln!(text, "\n{}", fit(&format!("(no answer: {e})"), cols));
        }
        let text: String = text
            .lines()
            .take(rows)
            .collect::<Vec<_>>()
            .join("\x1b[K\r\n");
        // Home, the frame (each line erased to its end), then erase the rest of the screen.
        let _ = write!(out, "\x1b[H{text}\x1b[K\r\n\x1b[J");
        let _ = out.flush();
        match term.wait_key(interval) {
            Ok(true) => break Ok(()),
            Ok(false) => {}
            Err(e) => break Err(e),
        }
    };
    drop(term);
    result
}

fn fetch(socket: &std::path::Path) -> Result<StatusReport> {
    let payload =
        super::client::request(socket, Kind::StatusRequest, Bytes::new(), Kind::StatusReply)?;
    serde_json::from_slice(&payload).context("the agent's status reply is not valid")
}

/// Width of the memory bar, between its brackets.
const BAR: usize = 20;

/// One frame: a header, one row per cgroup, the node's counters. `interval` is shown in the
/// header of the live view; lines are cut to `cols`.
pub fn frame(report: &StatusReport, interval: Option<Duration>, cols: usize) -> String {
    let mut out = String::new();
    let limited = report
        .cgroups
        .iter()
        .filter(|c| c.memory_limit_bytes.is_some())
        .count();
    let denied: u64 = report.cgroups.iter().map(|c| c.alloc_denied).sum();
    let mut head = format!(
        "fgpu top - {} cgroups using a GPU, {limited} with a memory limit, {denied} allocations denied (reported by the tenants)",
        report.cgroups.len()
    );
    if let Some(i) = interval {
        let _ = write!(head, " - every {:.1}s, q quits", i.as_secs_f64());
    }
    let _ = writeln!(out, "{}", fit(&head, cols));
    let name_w = report
        .cgroups
        .iter()
        .map(|c| name(c).chars().count())
        .chain([9])
        .max()
        .unwrap_or(9)
        .min(48);
    let _ = writeln!(
        out,
        "{}",
        fit(
            &format!(
                "{:<name_w$}  {:<w$}  {:>10}  {:>10}  {:>7}  {:>6}  {:>6}  {:>6}  {:>6}",
                "CONTAINER",
                "MEMORY",
                "USED",
                "LIMIT",
                "DENIED*",
                "SHARE",
                "CAP",
                "TURNS",
                "GPU",
                w = BAR + 7
            ),
            cols
        )
    );
    for c in &report.cgroups {
        let line = format!(
            "{:<name_w$}  {}  {:>10}  {:>10}  {:>7}  {:>6}  {:>6}  {:>6}  {:>6}",
            cut(&name(c), name_w),
            bar(c.memory_used_bytes, c.memory_limit_bytes),
            Size(c.memory_used_bytes).to_string(),
            c.memory_limit_bytes
                .map_or_else(|| "-".to_string(), |l| Size(l).to_string()),
            c.alloc_denied,
            pct(c.compute_share_pct.map(f64::from), 0),
            pct(c.compute_cap_pct.map(f64::from), 0),
            if c.compute_corun {
                "co-run".to_string()
            } else {
                pct(c.compute_turn_pct, 1)
            },
            pct(c.compute_used_pct, 1),
        );
        let _ = writeln!(out, "{}", fit(&line, cols));
    }
    if report.cgroups.is_empty() {
        let _ = writeln!(out, "(no cgroup holds GPU memory)");
    }
    if !report.own_only {
        let k = &report.counters;
        let _ = writeln!(
            out,
            "{}",
            fit(
                &format!(
                    "kernel: {} events dropped, {} untracked, {} over a limit, {} killed; {} libraries probed",
                    k.ringbuf_drops,
                    k.map_full + k.over_bound,
                    k.over_limit,
                    k.killed,
                    report.libraries.len()
                ),
                cols
            )
        );
    }
    out
}

/// What a row is called: the cgroup path, with the container id cut to 12 digits (as
/// `docker ps` shows it) where the path names one; escaped ([`fgpu_common::inert`]), as
/// a tenant may have chosen the name.
fn name(c: &CgroupStatus) -> String {
    let path = fgpu_common::inert::escape(&c.cgroup).into_owned();
    match fgpu_common::cgroup::naming::identity(&c.cgroup).container {
        Some(ctr) => path.replace(&ctr.id, ctr.short()),
        None => path,
    }
}

/// `[#########...........] 45%` for used against the limit; spaces and `-` without one.
fn bar(used: u64, limit: Option<u64>) -> String {
    let Some(limit) = limit.filter(|l| *l > 0) else {
        return format!("[{}]    -", " ".repeat(BAR));
    };
    let ratio = used as f64 / limit as f64;
    let filled = ((ratio * BAR as f64).round() as usize).min(BAR);
    format!(
        "[{}{}] {:>3}%",
        "#".repeat(filled),
        ".".repeat(BAR - filled),
        (ratio * 100.0).round().min(999.0) as u64
    )
}

fn pct(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".to_string(), |p| format!("{p:.decimals$}%"))
}

/// `s` cut to `n` characters, the cut marked with `~`.
fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        return s.to_string();
    }
    let mut out: String = s.chars().take(n.saturating_sub(1)).collect();
    out.push('~');
    out
}

fn fit(line: &str, cols: usize) -> String {
    line.chars().take(cols).collect()
}

/// The terminal's columns and rows (80 x 24 when it does not say).
fn term_size() -> (usize, usize) {
    // SAFETY: winsize is plain data; TIOCGWINSZ writes it or fails.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd and a valid out-pointer for TIOCGWINSZ.
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) };
    if rc == 0 && ws.ws_col > 0 && ws.ws_row > 0 {
        (usize::from(ws.ws_col), usize::from(ws.ws_row))
    } else {
        (80, 24)
    }
}

/// The terminal while the live view runs: the alternate screen, no cursor, and (when stdin is
/// a terminal) keys read one by one without echo. Restored on drop.
struct Terminal {
    saved: Option<libc::termios>,
}

impl Terminal {
    fn enter() -> Self {
        let mut saved = None;
        // SAFETY: termios is plain data; tcgetattr fills it or fails.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: stdin's fd and a valid out-pointer.
        if unsafe { libc::tcgetattr(libc::STDIN_FILENO, &mut t) } == 0 {
            saved = Some(t);
            // No line buffering, no echo, and Ctrl-C as a key (so that the terminal is
            // always restored on the way out).
            t.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG);
            t.c_cc[libc::VMIN] = 0;
            t.c_cc[libc::VTIME] = 0;
            // SAFETY: stdin's fd and a termios derived from its own settings.
            unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &t) };
        }
        print!("\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J");
        let _ = std::io::stdout().flush();
        Terminal { saved }
    }

    /// Waits up to `timeout` for a key; true when it asks to quit (`q`, Ctrl-C, Ctrl-D).
    fn wait_key(&self, timeout: Duration) -> Result<bool> {
        if self.saved.is_none() {
            std::thread::sleep(timeout);
            return Ok(false);
        }
        let mut fd = libc::pollfd {
            fd: libc::STDIN_FILENO,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut fd, 1, ms) };
        if n <= 0 {
            return Ok(false);
        }
        let mut buf = [0u8; 64];
        // SAFETY: reads into a buffer of the length given.
        let got = unsafe { libc::read(libc::STDIN_FILENO, buf.as_mut_ptr().cast(), buf.len()) };
        if got == 0 && fd.revents & libc::POLLHUP != 0 {
            return Ok(true);
        }
        let got = usize::try_from(got).unwrap_or(0);
        Ok(buf[..got]
            .iter()
            .any(|b| matches!(b, b'q' | b'Q' | 0x03 | 0x04)))
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        print!("\x1b[?25h\x1b[?1049l");
        let _ = std::io::stdout().flush();
        if let Some(t) = &self.saved {
            // SAFETY: stdin's fd and the settings read from it at start.
            unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, t) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cgroup: &str, used: u64, limit: Option<u64>, denied: u64) -> CgroupStatus {
        CgroupStatus {
            memory_used_bytes: used,
            memory_limit_bytes: limit,
            alloc_denied: denied,
            ..CgroupStatus::empty(cgroup.into())
        }
    }

    #[test]
    fn the_bar_is_used_over_the_limit() {
        assert_eq!(bar(1 << 29, Some(1 << 30)), "[##########..........]  50%");
        assert_eq!(bar(0, Some(1 << 30)), "[....................]   0%");
        assert_eq!(bar(3 << 30, Some(1 << 30)), "[####################] 300%");
        assert_eq!(bar(5, None), "[                    ]    -");
    }

    #[test]
    fn a_frame_has_a_row_per_container() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let report = StatusReport {
            cgroups: vec![
                CgroupStatus {
                    compute_share_pct: Some(30),
                    compute_used_pct: Some(28.25),
                    compute_turn_pct: Some(31.0),
                    ..row("/fgpu/a", 768 << 20, Some(1 << 30), 2)
                },
                row(
                    &format!("/system.slice/docker-{id}.scope"),
                    1 << 30,
                    None,
                    0,
                ),
            ],
            ..StatusReport::default()
        };
        let f = frame(&report, None, usize::MAX);
        let lines: Vec<&str> = f.lines().collect();
        assert!(
            lines[0].contains("2 cgroups using a GPU, 1 with a memory limit, 2 allocations denied"),
            "{f}"
        );
        assert!(
            lines[1].starts_with("CONTAINER") && lines[1].contains("DENIED"),
            "{f}"
        );
        let a = lines[2];
        assert!(a.starts_with("/fgpu/a "), "{f}");
        assert!(a.contains("[###############.....]  75%"), "{f}");
        assert!(a.contains("768MiB") && a.contains("1GiB"), "{f}");
        assert!(
            a.contains(" 2 ") && a.contains("30%") && a.contains("28.2%") && a.contains("31.0%"),
            "{f}"
        );
        assert!(
            lines[3].starts_with("/system.slice/docker-0123456789ab.scope"),
            "{f}"
        );
        assert!(lines[4].starts_with("kernel: 0 events dropped"), "{f}");
        let narrow = frame(&report, Some(Duration::from_secs(2)), 30);
        assert!(narrow.lines().all(|l| l.chars().count() <= 30), "{narrow}");
    }

    #[test]
    fn names_tenants_chose_reach_the_terminal_escaped() {
        // Escaped, it fits the column (48 characters at most).
        let evil = "/t\x1b[2J\x1b]52;c;YQ==\x07\rr\u{2067}\u{9b}";
        let report = StatusReport {
            cgroups: vec![row(evil, 1 << 20, None, 3)],
            ..StatusReport::default()
        };
        let f = frame(&report, None, usize::MAX);
        for line in f.lines() {
            assert!(
                line.chars().all(|c| (' '..='~').contains(&c)),
                "raw control or format characters in {line:?}"
            );
        }
        assert!(
            f.contains("/t\\x1b[2J\\x1b]52;c;YQ==\\x07\\x0dr\\u{2067}\\u{9b} "),
            "{f}"
        );
        assert!(
            f.contains("DENIED*") && f.contains("(reported by the tenants)"),
            "{f}"
        );
    }
}
