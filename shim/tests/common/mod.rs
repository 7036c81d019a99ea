//! Test harness: the built libfgpu.so preloaded into clients that drive the simulated driver
//! (fgpu-sim), each test with its own simulated device state and its own ledger.

#![allow(dead_code)]

pub mod agent;
pub mod classes;
pub mod client;
pub mod tenants;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
/// What fgpu-sim charges per process context (FGPU_SIM_CONTEXT_OVERHEAD default).
pub const OVERHEAD: u64 = 300 * MIB;
pub const DEVICE: u64 = 16 * GIB;
/// A socket path where no agent listens (standalone tests).
pub const NO_AGENT: &str = "/nonexistent/fgpu-test/fgpu.sock";

/// target/<profile>, found from this test binary (target/<profile>/deps/<name>-<hash>).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps")
        .to_path_buf()
}

fn need(p: PathBuf) -> PathBuf {
    assert!(
        p.exists(),
        "{} is missing: build the workspace first (`cargo xtask test`, or \
         `cargo build -p fgpu-shim -p fgpu-sim` with the same profile and target dir)",
        p.display()
    );
    p
}

/// Newest modification time of the files under `dir`.
fn newest(dir: &Path) -> std::time::SystemTime {
    let mut t = std::time::SystemTime::UNIX_EPOCH;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let m = if p.is_dir() {
            newest(&p)
        } else {
            e.metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::SystemTime::UNIX_EPOCH)
        };
        t = t.max(m);
    }
    t
}

/// `cargo test` does not rebuild a cdylib: refuse to test a libfgpu.so older than its sources.
fn assert_fresh(shim: &Path) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"));
    let built = std::fs::metadata(shim)
        .and_then(|m| m.modified())
        .unwrap_or(std::time::SystemTime::UNIX_EPOCH);
    let newest_src = newest(&src.join("src")).max(newest(&src.join("../fgpu-common/src")));
    assert!(
        built >= newest_src,
        "{} is older than the shim's sources: rebuild it first (`cargo xtask test`, or \
         `cargo build -p fgpu-shim -p fgpu-sim`; `cargo test` alone does not rebuild a cdylib)",
        shim.display()
    );
}

/// One test's world: a lib dir with libcuda.so.1/libnvidia-ml.so.1 → fgpu-sim, a sim state
/// file and a ledger file of its own.
pub struct World {
    pub name: String,
    pub libdir: PathBuf,
    pub state: String,
    pub ledger: String,
    pub shim: PathBuf,
    pub load: PathBuf,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

impl World {
    pub fn new(name: &str) -> World {
        let t = target_dir();
        let shim = need(t.join("libfgpu.so"));
        assert_fresh(&shim);
        let sim = need(t.join("libfgpu_sim.so"));
        let load = need(t.join("fgpu-sim-load"));
        let unique = format!(
            "{name}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let libdir = std::env::temp_dir().join(format!("fgpu-shim-test-{unique}"));
        let _ = std::fs::remove_dir_all(&libdir);
        std::fs::create_dir_all(&libdir).unwrap();
        for n in ["libcuda.so.1", "libnvidia-ml.so.1"] {
            std::os::unix::fs::symlink(&sim, libdir.join(n)).unwrap();
        }
        World {
            name: name.into(),
            libdir,
            state: format!("/dev/shm/fgpu-shim-test-sim-{unique}"),
            ledger: format!("/dev/shm/fgpu-shim-test-ledger-{unique}"),
            shim,
            load,
        }
    }

    /// A command with the sim on the library path, this world's state, and the shim
    /// preloaded (unless `preload` is false). The shim measures context overhead itself.
    pub fn cmd(&self, program: &Path, preload: bool) -> Command {
        let mut c = Command::new(program);
        c.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("LD_LIBRARY_PATH", &self.libdir)
            .env("FGPU_SIM_STATE", &self.state)
            .env("FGPU_SIM_MEMORY", "16GiB")
            .env("FGPU_LEDGER", &self.ledger)
            // Standalone mode, whatever runs on this machine: no agent at this socket.
            .env("FGPU_SOCKET", NO_AGENT)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if preload {
            c.env("LD_PRELOAD", &self.shim);
        }
        c
    }

    /// fgpu-sim-load with the shim and `env`.
    pub fn load(&self, env: &[(&str, &str)], args: &[&str]) -> Out {
        let mut c = self.cmd(&self.load, true);
        c.envs(env.iter().copied()).args(args);
        run(c, 30)
    }

    /// fgpu-sim-load without the shim (sees the simulated device as it really is).
    pub fn observe(&self) -> Out {
        let mut c = self.cmd(&self.load, false);
        c.arg("nvml");
        run(c, 30)
    }

    /// Device memory the simulated driver has handed out to all processes but the observer
    /// (which holds a context of its own).
    pub fn device_used(&self) -> u64 {
        let o = self.observe();
        let me = o.field("pid=", "pid");
        let mine: u64 = o
            .lines("nvml process device=0")
            .iter()
            .filter(|l| field(l, "pid") == me)
            .map(|l| field(l, "used"))
            .sum();
        o.field("nvml device=0", "used") - mine
    }

    /// fgpu-sim-load with the shim that runs `args` then waits ("hold") until released.
    pub fn hold(&self, env: &[(&str, &str)], args: &[&str]) -> Held {
        let mut c = self.cmd(&self.load, true);
        c.envs(env.iter().copied())
            .args(args)
            .arg("hold")
            .stdin(Stdio::piped());
        Held::start(c)
    }

    /// This test binary as a client (see `client`), with the shim.
    pub fn client(&self, env: &[(&str, &str)], mode: &str, args: &[&str]) -> Out {
        let exe = std::env::current_exe().unwrap();
        let mut c = self.cmd(&exe, true);
        c.envs(env.iter().copied())
            .env("FGPU_TEST_CLIENT", mode)
            .env("FGPU_TEST_CLIENT_ARGS", args.join(" "))
            .args([
                "--exact",
                "client_entry",
                "--nocapture",
                "-q",
                "--test-threads=1",
            ]);
        run(c, 60)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.state);
        let _ = std::fs::remove_file(&self.ledger);
        let _ = std::fs::remove_dir_all(&self.libdir);
    }
}

/// A finished process.
#[derive(Debug)]
pub struct Out {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn lines(&self, prefix: &str) -> Vec<&str> {
        self.stdout
            .lines()
            .filter(|l| l.starts_with(prefix))
            .collect()
    }

    /// `key=` value of the first line starting with `prefix`.
    pub fn field(&self, prefix: &str, key: &str) -> u64 {
        let line =
            self.lines(prefix).first().copied().unwrap_or_else(|| {
                panic!("no '{prefix}' line in:\n{}\n{}", self.stdout, self.stderr)
            });
        field(line, key)
    }

    /// Results of the alloc steps, in order: Ok(size) or Err(rc).
    pub fn allocs(&self) -> Vec<Result<u64, u64>> {
        self.lines("alloc ")
            .iter()
            .map(|l| {
                if l.starts_with("alloc ok") {
                    Ok(field(l, "size"))
                } else {
                    Err(field(l, "rc"))
                }
            })
            .collect()
    }
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

pub fn field(line: &str, key: &str) -> u64 {
    let k = format!("{key}=");
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&k))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no numeric {key}= in '{line}'"))
}

fn reader<R: Read + Send + 'static>(r: R) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = BufReader::new(r).read_to_string(&mut s);
        s
    })
}

/// How a `bench-launch` run is started: without the shim, with it and no cap (the ungated
/// path), or with it and a cap (the gated path).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Launcher {
    Bare,
    Ungated,
    Gated,
}

/// `ns_per_launch=` of one `bench-launch` run.
pub fn ns_per_launch(c: Command) -> f64 {
    let o = run(c, 120);
    assert_eq!(o.code, Some(0), "{o}");
    o.lines("bench-launch ok")[0]
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ns_per_launch="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no ns_per_launch in {o}"))
}

/// The lowest `ns_per_launch=` of `rounds` `bench-launch` runs of each launcher, interleaved
/// (bare, ungated, gated): `cmd(launcher)` makes one run's command.
pub fn best_ns_per_launch(rounds: usize, cmd: impl Fn(Launcher) -> Command) -> [f64; 3] {
    let mut best = [f64::MAX; 3];
    for _ in 0..rounds {
        for (i, l) in [Launcher::Bare, Launcher::Ungated, Launcher::Gated]
            .into_iter()
            .enumerate()
        {
            best[i] = best[i].min(ns_per_launch(cmd(l)));
        }
    }
    best
}

/// The ungated launch path is an interposed symbol, one atomic load and a jump: it must cost
/// next to nothing beside the bare driver and far less than the gated path (events, stream
/// queries, the turn protocol). `measure` takes one interleaved best-of-N sample
/// ([`best_ns_per_launch`]). A launch that entered the gate costs more in every sample; a
/// shared 2-core CI machine moves a sample now and then (a CI run saw bare 1278 ns, ungated
/// 2018 ns, where every local run is within ±11%), so a sample that fails is taken again,
/// up to three, and the check fails only if all three do.
pub fn assert_ungated_is_free(what: &str, measure: impl Fn() -> [f64; 3]) {
    let mut failures = Vec::new();
    for _ in 0..3 {
        let sample = measure();
        match ungated_sample(what, sample) {
            Ok(()) => return,
            Err(e) => failures.push(e),
        }
    }
    panic!("{}", failures.join("\n"));
}

fn ungated_sample(what: &str, [bare, ungated, gated]: [f64; 3]) -> Result<(), String> {
    println!(
        "{what}: {bare:.0} ns/launch without the shim, {ungated:.0} with it and no cap \
         ({:+.1}%), {gated:.0} gated",
        100.0 * (ungated - bare) / bare
    );
    // The shim is built optimised (as users run it): its gated path costs ~1.3 µs more than
    // a 2.8 µs bare launch of the simulator's `empty` kernel on a 2-core CI machine (it
    // cost 1.5 × bare and more in the debug build).
    if !(gated > bare * 1.25 && gated - bare >= 500.0) {
        return Err(format!(
            "{what}: the gated path ({gated:.0} ns) should cost clearly more than bare \
             ({bare:.0} ns); is the cap applied?"
        ));
    }
    if !(ungated <= bare * 1.25 && ungated - bare <= 0.2 * (gated - bare)) {
        return Err(format!(
            "{what}: launch overhead without a cap: {bare:.0} -> {ungated:.0} ns \
             (gated {gated:.0} ns)"
        ));
    }
    Ok(())
}

/// Runs `c` to completion; panics if it takes longer than `secs`.
pub fn run(mut c: Command, secs: u64) -> Out {
    let mut child = c.spawn().expect("spawn");
    let out = reader(child.stdout.take().unwrap());
    let err = reader(child.stderr.take().unwrap());
    let code = wait(&mut child, secs);
    Out {
        code,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

fn wait(child: &mut Child, secs: u64) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process did not finish within {secs}s (hang?)");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A process parked at `hold` (it has printed "ready").
pub struct Held {
    child: Child,
    pub before: String,
    out: Option<BufReader<std::process::ChildStdout>>,
    err: Option<std::thread::JoinHandle<String>>,
}

impl Held {
    pub fn start(mut c: Command) -> Held {
        let mut child = c.spawn().expect("spawn");
        let err = reader(child.stderr.take().unwrap());
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut before = String::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut line = String::new();
            let n = out.read_line(&mut line).unwrap_or(0);
            if n == 0 {
                let _ = child.kill();
                panic!(
                    "client exited before 'ready':\n{before}\n{}",
                    err.join().unwrap()
                );
            }
            before.push_str(&line);
            if line.trim() == "ready" {
                break;
            }
            assert!(Instant::now() < deadline, "no 'ready' within 30s");
        }
        Held {
            child,
            before,
            out: Some(out),
            err: Some(err),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn allocs(&self) -> Vec<Result<u64, u64>> {
        Out {
            code: None,
            stdout: self.before.clone(),
            stderr: String::new(),
        }
        .allocs()
    }

    /// Lets it finish.
    pub fn release(mut self) -> Out {
        if let Some(mut i) = self.child.stdin.take() {
            let _ = i.write_all(b"");
        }
        let code = wait(&mut self.child, 30);
        let mut rest = String::new();
        if let Some(mut o) = self.out.take() {
            let _ = o.read_to_string(&mut rest);
        }
        Out {
            code,
            stdout: format!("{}{rest}", self.before),
            stderr: self
                .err
                .take()
                .map(|e| e.join().unwrap())
                .unwrap_or_default(),
        }
    }

    /// SIGKILL.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asserts the alloc steps went `ok` exactly `oks` times, then failed with code 2.
pub fn assert_ok_then_oom(allocs: &[Result<u64, u64>], oks: usize, ctx: &dyn std::fmt::Display) {
    assert!(
        allocs.len() > oks,
        "expected {oks} successes then a failure:\n{ctx}"
    );
    for (i, a) in allocs.iter().take(oks).enumerate() {
        assert!(a.is_ok(), "allocation {i} should succeed:\n{ctx}");
    }
    assert_eq!(
        allocs[oks],
        Err(2),
        "allocation {oks} should fail with CUDA_ERROR_OUT_OF_MEMORY:\n{ctx}"
    );
}
