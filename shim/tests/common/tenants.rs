//! Compute tenants for the agent tests (CUDA and HIP alike): a workload in a cgroup of its
//! own with a compute setting, held at its start line until all are released together, and
//! the shares they report.

use super::agent::{Agent, AgentWorld, Cgroup, Proc, mono_ns, unique};
use super::field;
use fgpu_common::ledger::{Ledger, MAX_DEVICES};
pub use fgpu_testkit::shares::{CpuMeter, Measured, assert_shares};
use std::cell::Cell;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// Held while a test measures shares; see [`measuring`].
pub struct Measuring(Option<MutexGuard<'static, ()>>);

thread_local! {
    static MEASURING_HERE: Cell<bool> = const { Cell::new(false) };
}

/// Share measurements run one at a time in a test binary: libtest runs a binary's tests on
/// as many threads as there are cores, and two 10 s measurements side by side on a 2-core
/// machine starve each other's launchers (a full `cargo xtask test` measured 47.0 / 48.2 for
/// a 50 / 50 pair, and 28.8 / 66.9 for 30 / 70, with the device idle 4-5% of the time).
/// A test takes it before anything it times starts (a setting changed on a timer, say);
/// taken again on the same thread (by [`run_together`]) it is already held.
pub fn measuring() -> Measuring {
    static MEASURING: Mutex<()> = Mutex::new(());
    if MEASURING_HERE.with(Cell::get) {
        return Measuring(None);
    }
    let guard = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    MEASURING_HERE.with(|h| h.set(true));
    Measuring(Some(guard))
}

impl Drop for Measuring {
    fn drop(&mut self) {
        if self.0.is_some() {
            MEASURING_HERE.with(|h| h.set(false));
        }
    }
}

/// `elapsed_ms=` of a workload's result line.
pub fn elapsed_ms(line: &str) -> f64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("elapsed_ms="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no elapsed_ms in '{line}'"))
}

/// The device share a `launch-for` (n × 1 ms kernels) or `graph-for` (replays of 10 ms)
/// result line achieved, percent of its wall time.
pub fn share(line: &str) -> f64 {
    let gpu_ms = if line.starts_with("graph-for") {
        field(line, "replays") as f64 * 10.0
    } else {
        field(line, "n") as f64
    };
    100.0 * gpu_ms / elapsed_ms(line)
}

pub struct Tenant {
    pub name: String,
    pub cg: Cgroup,
    pub proc: Option<Proc>,
}

/// `program` (`hold` then `work`) in a new cgroup `fgpu-PREFIX-NAME-…` with the limit
/// `options`, waiting at its start line.
pub fn tenant_of(
    w: &AgentWorld,
    program: &Path,
    prefix: &str,
    name: &str,
    options: &[&str],
    work: &[&str],
) -> Tenant {
    let cg = Cgroup::new(&unique(&format!("fgpu-{prefix}-{name}")));
    if !options.is_empty() {
        w.set_limits(&cg, options);
    }
    let mut args = vec!["hold"];
    args.extend(work);
    let mut proc = Proc::start(w.command(&cg, &[("FGPU_LOG", "info")], program, &args));
    proc.expect("ready");
    Tenant {
        name: name.to_string(),
        cg,
        proc: Some(proc),
    }
}

/// Starts all tenants at once; returns each one's result lines (`launch-for ok` or
/// `graph-for ok`) in order, and the agent's `fgpu status --json` taken `status_after_ms` in.
pub fn run_together(
    w: &AgentWorld,
    agent: &Agent,
    tenants: &mut [Tenant],
    status_after_ms: u64,
) -> (Vec<Vec<String>>, String) {
    let _one = measuring();
    for t in tenants.iter_mut() {
        t.proc.as_mut().unwrap().release();
    }
    std::thread::sleep(std::time::Duration::from_millis(status_after_ms));
    let (_, status) = w.fgpu(&["status", "--json"]);
    let mut out = Vec::new();
    for t in tenants.iter_mut() {
        let f = t.proc.take().unwrap().finish();
        let ctx = format!(
            "tenant {} ({}):\n{:#?}\n{}\nagent log:\n{}",
            t.name,
            t.cg.path,
            f.lines,
            f.stderr,
            agent.log_text()
        );
        for l in f.stderr.lines().filter(|l| l.contains("compute gate")) {
            println!("  {}: {l}", t.name);
        }
        assert_eq!(f.code, Some(0), "{ctx}");
        assert!(
            !f.stderr.contains("capping at"),
            "the agent's controller was there all along: {ctx}"
        );
        let results: Vec<String> = f
            .lines
            .iter()
            .filter(|l| l.starts_with("launch-for ok") || l.starts_with("graph-for ok"))
            .cloned()
            .collect();
        assert!(!results.is_empty(), "{ctx}");
        out.push(results);
    }
    (out, status)
}

/// Runs a tenant at 30 and one at 70 together (`run_together`, status 6 s in) and checks what
/// both the CUDA and the HIP tests promise: each within ±3 points of its share of the work
/// done, the device ≥ 90% busy (`fgpu_testkit::shares`), and `fgpu status` showing the 30% one's setting and an achieved share within
/// ±5. `label` names the pair in the printed figures.
pub fn expect_30_70(label: &str, w: &AgentWorld, agent: &Agent, ts: &mut [Tenant]) {
    let cpu = CpuMeter::start();
    let (results, status) = run_together(w, agent, ts, 6000);
    let shares: Vec<f64> = results.iter().map(|r| share(&r[0])).collect();
    let ctx = format!("{results:#?}\nagent log:\n{}", agent.log_text());
    assert_shares(
        &format!("{label}30/70 over 10 s"),
        &[
            Measured::new("graphs", shares[0], 30.0),
            Measured::new("kernels", shares[1], 70.0),
        ],
        3.0,
        &cpu,
        &ctx,
    );
    let (cfg, used) = status_compute(&status, &ts[0].cg.path);
    println!(
        "fgpu status during the run: {} share {cfg:?}% used {used:?}%",
        ts[0].cg.path
    );
    assert_eq!(cfg, Some(30), "{status}");
    let used = used.unwrap_or_else(|| panic!("no achieved share in {status}"));
    assert!((used - 30.0).abs() <= 5.0, "{status}");
}

/// The compute figures of `cgroup` in a `fgpu status --json` report: (share, used %).
pub fn status_compute(status: &str, cgroup: &str) -> (Option<u64>, Option<f64>) {
    let v: serde_json::Value = serde_json::from_str(status).expect("status JSON");
    // `--json` prints the rows; `--json --detail` the whole report.
    let rows = v.as_array().or_else(|| v["cgroups"].as_array());
    let row = rows
        .and_then(|a| a.iter().find(|r| r["cgroup"] == cgroup))
        .unwrap_or_else(|| panic!("no row for {cgroup} in {status}"));
    (
        row["compute_share_pct"].as_u64(),
        row["compute_used_pct"].as_f64(),
    )
}

// ---- killing a tenant at a bad moment, and what its neighbour made of it ----

/// The usage memfd a process of a tenant holds, mapped read-only as the usage part of a
/// ledger (the limits page is not mapped: only `usage` and `slots` may be read).
pub fn usage_of(pid: u32) -> &'static Ledger {
    let fd_dir = format!("/proc/{pid}/fd");
    let path = std::fs::read_dir(&fd_dir)
        .unwrap_or_else(|e| panic!("{fd_dir}: {e}"))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            std::fs::read_link(p)
                .is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:fgpu-usage"))
        })
        .unwrap_or_else(|| panic!("process {pid} holds no usage memfd"));
    let f = std::fs::File::open(&path).expect("opening the usage memfd");
    use std::os::fd::AsRawFd;
    let size = fgpu_common::ledger::LEDGER_SIZE;
    // SAFETY: a fresh reservation of the ledger's size, then the usage memfd mapped
    // read-only over its part after the first page; never unmapped (leaked for the test).
    unsafe {
        let base = libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(base, libc::MAP_FAILED);
        let page = fgpu_common::ledger::PAGE;
        let u = libc::mmap(
            base.cast::<u8>().add(page).cast(),
            size - page,
            libc::PROT_READ,
            libc::MAP_SHARED | libc::MAP_FIXED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(u, libc::MAP_FAILED);
        &*(base as *const Ledger)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Moment {
    /// A thread of it waits for a turn.
    Waiting,
    /// It holds the turn and has batches in flight.
    Holding,
}

/// Waits (up to 5 s) until the tenant's only process is at `m`, as its own slot says.
pub fn wait_for(l: &Ledger, m: Moment) -> bool {
    let deadline = mono_ns() + 5_000_000_000;
    let at = |l: &Ledger| {
        let mut waiting = false;
        let mut inflight = false;
        for s in &l.slots[..l.slots_in_range()] {
            for c in &s.compute[..MAX_DEVICES] {
                waiting |= c.wait_beat.load(std::sync::atomic::Ordering::SeqCst) != 0;
                inflight |= c.inflight.load(std::sync::atomic::Ordering::SeqCst) > 0;
            }
        }
        match m {
            Moment::Waiting => waiting,
            Moment::Holding => !waiting && inflight,
        }
    };
    while mono_ns() < deadline {
        if at(l) {
            std::thread::sleep(Duration::from_micros(300));
            if at(l) {
                return true;
            }
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    false
}

/// (mono ms, steps) of every `steps-at` line.
pub fn progress(lines: &[String]) -> Vec<(u64, u64)> {
    lines
        .iter()
        .filter(|l| l.starts_with("steps-at"))
        .map(|l| (field(l, "mono_ms"), field(l, "steps")))
        .collect()
}

/// Steps per second over [from, to] (mono ms), from progress samples.
pub fn rate_between(p: &[(u64, u64)], from: u64, to: u64) -> f64 {
    let first = p.iter().find(|&&(t, _)| t >= from).copied();
    let last = p.iter().rev().find(|&&(t, _)| t <= to).copied();
    match (first, last) {
        (Some((t0, s0)), Some((t1, s1))) if t1 > t0 => (s1 - s0) as f64 * 1000.0 / (t1 - t0) as f64,
        _ => panic!("no progress samples between {from} and {to}: {p:?}"),
    }
}

/// The longest run of progress samples within [from, to] (mono ms) with no step between them,
/// ms: how long the tenant was held off the device.
pub fn longest_stall(p: &[(u64, u64)], from: u64, to: u64) -> u64 {
    let (mut run, mut longest) = (0, 0);
    for w in p.windows(2).filter(|w| w[0].0 >= from && w[1].0 <= to) {
        run = if w[1].1 == w[0].1 {
            run + w[1].0 - w[0].0
        } else {
            0
        };
        longest = longest.max(run);
    }
    longest
}
