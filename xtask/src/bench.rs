//! `cargo xtask bench`: the kernel-accounting benchmark on the simulated driver.
//!
//! Measures what the probes add to an allocation/free pair (the same client with and
//! without the agent attached), and how many events per second the kernel side and the
//! agent absorb without loss (8 threads of alloc/free pairs, then the drop counter).
//! Release builds only; needs root (the agent loads eBPF programs). The figures are for
//! `docs/benchmarks.md`; the H200 figures come from `tests/gpu/attribution.sh`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::build::{release, sim_dir};
use crate::util::{is_root, step};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Alloc/free pairs per timing run (5 runs, the median is reported).
    #[arg(long, default_value_t = 200_000)]
    pairs: u64,
}

pub fn run(args: &BenchArgs) -> Result<()> {
    if !is_root() {
        bail!(
            "the benchmark starts the agent, which loads eBPF programs: run as root (`sudo -E cargo xtask bench`)"
        );
    }
    let release_dir = release()?;
    let state = PathBuf::from(format!("/dev/shm/fgpu-bench-{}", std::process::id()));
    let load = |extra: &[&str]| -> Result<String> {
        let out = Command::new(sim_dir().join("fgpu-sim-load"))
            .args(extra)
            .env("LD_LIBRARY_PATH", sim_dir())
            .env("FGPU_SIM_STATE", &state)
            .output()
            .context("running fgpu-sim-load")?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() || text.contains(" fail ") {
            bail!("fgpu-sim-load {extra:?} failed:\n{text}");
        }
        Ok(text)
    };
    let pairs = args.pairs.to_string();
    let median_ns = |label: &str| -> Result<u64> {
        step(label);
        let mut runs = Vec::new();
        for _ in 0..5 {
            let text = load(&["bench-alloc", &pairs, "2MiB"])?;
            runs.push(field(&text, "ns_per_pair").context("bench-alloc printed no ns_per_pair")?);
        }
        runs.sort_unstable();
        println!("ns per pair, 5 runs: {runs:?}");
        Ok(runs[2])
    };

    let without = median_ns("alloc/free pairs, no agent")?;
    let agent = AgentProcess::start(&release_dir.join("fgpu"))?;
    let with = median_ns("alloc/free pairs, agent attached")?;

    step("event throughput: 8 threads x 50 000 alloc/free pairs");
    let before = agent.dropped()?;
    let start = Instant::now();
    let text = load(&["stress", "8", "50000", "1MiB"])?;
    let elapsed = start.elapsed();
    // Give the agent a moment to drain what is still queued, then read the counter.
    std::thread::sleep(Duration::from_millis(500));
    let dropped = agent.dropped()? - before;
    let events = 8 * 50_000 * 2;
    let rate = events as f64 / elapsed.as_secs_f64();
    print!("{text}");
    drop(agent);
    let _ = std::fs::remove_file(&state);

    println!("\n| measure | value |\n|---|---|");
    println!(
        "| alloc+free pair, no agent | {:.2} µs |",
        without as f64 / 1000.0
    );
    println!(
        "| alloc+free pair, probes attached | {:.2} µs |",
        with as f64 / 1000.0
    );
    println!(
        "| added per pair | {:.2} µs |",
        (with as f64 - without as f64) / 1000.0
    );
    println!("| events (8 threads, {events} events) | {rate:.0} events/s, {dropped} dropped |");
    if dropped > 0 {
        bail!("{dropped} events were dropped");
    }
    Ok(())
}

/// The number after `name=` in fgpu-sim-load output.
fn field(text: &str, name: &str) -> Option<u64> {
    let at = text.find(&format!("{name}="))? + name.len() + 1;
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

struct AgentProcess {
    child: Child,
    fgpu: PathBuf,
    socket: PathBuf,
    /// The agent's pinned probes and maps: removed afterwards, which detaches them.
    bpf_dir: PathBuf,
    state_dir: PathBuf,
}

impl AgentProcess {
    fn start(fgpu: &Path) -> Result<Self> {
        let socket = PathBuf::from(format!("/tmp/fgpu-bench-{}.sock", std::process::id()));
        let bpf_dir = PathBuf::from(format!("/sys/fs/bpf/fgpu-bench-{}", std::process::id()));
        let state_dir = PathBuf::from(format!("/tmp/fgpu-bench-{}-state", std::process::id()));
        let child = Command::new(fgpu)
            .args(["agent", "--sim", "--log", "warn", "--socket"])
            .arg(&socket)
            .arg("--bpf-dir")
            .arg(&bpf_dir)
            .arg("--state-dir")
            .arg(&state_dir)
            .env("FGPU_SIM_DIR", sim_dir())
            .stdout(Stdio::null())
            .spawn()
            .context("starting the agent")?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            if Instant::now() > deadline {
                bail!("the agent did not start");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self {
            child,
            fgpu: fgpu.to_path_buf(),
            socket,
            bpf_dir,
            state_dir,
        })
    }

    fn dropped(&self) -> Result<u64> {
        let out = Command::new(&self.fgpu)
            .args(["status", "--json", "--detail", "--socket"])
            .arg(&self.socket)
            .output()?;
        let status: serde_json::Value =
            serde_json::from_slice(&out.stdout).context("fgpu status --json --detail")?;
        status["counters"]["ringbuf_drops"]
            .as_u64()
            .context("status has no ringbuf_drops")
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.bpf_dir);
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}
