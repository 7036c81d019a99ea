//! Helpers shared by the integration tests: locate the built library and the loader, give
//! each test its own LD_LIBRARY_PATH directory and state file, run and parse the loader.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// target/<profile>/libfgpu_sim.so (the test binary lives in target/<profile>/deps/).
///
/// `cargo test` does not build a cdylib-only library for integration tests, so the first
/// call builds it (`cargo build -p fgpu-sim --lib`, same profile and target directory),
/// which also keeps it from going stale.
pub fn lib_path() -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("profile dir");
    let target_dir = profile_dir.parent().expect("target dir");
    BUILT.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "--lib", "--manifest-path"])
            .arg(&manifest)
            .env("CARGO_TARGET_DIR", target_dir);
        match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => {}
            Some("release") => {
                cmd.arg("--release");
            }
            Some(other) => {
                cmd.args(["--profile", other]);
            }
            None => {}
        }
        let status = cmd.status().expect("run cargo build");
        assert!(status.success(), "building libfgpu_sim.so failed");
    });
    let lib = profile_dir.join("libfgpu_sim.so");
    assert!(lib.exists(), "{} not built", lib.display());
    lib
}

pub fn loader() -> &'static str {
    env!("CARGO_BIN_EXE_fgpu-sim-load")
}

/// A private directory with libcuda.so.1 / libnvidia-ml.so.1 symlinks and a state file.
pub struct SimEnv {
    pub dir: PathBuf,
    pub memory: String,
}

impl SimEnv {
    pub fn new(name: &str) -> SimEnv {
        Self::with_memory(name, "16GiB")
    }

    pub fn with_memory(name: &str, memory: &str) -> SimEnv {
        let dir = std::env::temp_dir().join(format!("fgpu-sim-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let lib = lib_path();
        for n in ["libcuda.so.1", "libnvidia-ml.so.1"] {
            std::os::unix::fs::symlink(&lib, dir.join(n)).expect("symlink");
        }
        SimEnv {
            dir,
            memory: memory.to_string(),
        }
    }

    pub fn state(&self) -> PathBuf {
        self.dir.join("state")
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(loader());
        c.args(args)
            .env("LD_LIBRARY_PATH", &self.dir)
            .env("FGPU_SIM_STATE", self.state())
            .env("FGPU_SIM_MEMORY", &self.memory)
            .env("FGPU_SIM_DEVICES", "1")
            .env("FGPU_SIM_CONTEXT_OVERHEAD", "300MiB")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        c
    }

    /// Runs the loader to completion; returns its stdout lines.
    pub fn run(&self, args: &[&str]) -> Vec<String> {
        let out = self
            .command(args)
            .stdin(Stdio::null())
            .output()
            .expect("run loader");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "loader {args:?} failed: {text}");
        text.lines().map(str::to_string).collect()
    }

    /// Starts the loader with `args` (ending in `hold`) and waits for `ready`.
    pub fn hold(&self, args: &[&str]) -> Holder {
        let mut child = self.command(args).spawn().expect("spawn loader");
        let mut reader = BufReader::new(child.stdout.take().expect("stdout"));
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            let n = reader.read_line(&mut line).expect("read");
            assert!(n > 0, "loader exited before ready: {lines:?}");
            let line = line.trim_end().to_string();
            if line == "ready" {
                break;
            }
            lines.push(line);
        }
        Holder {
            child,
            lines,
            _reader: reader,
        }
    }
}

impl Drop for SimEnv {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub struct Holder {
    pub child: Child,
    pub lines: Vec<String>,
    _reader: BufReader<ChildStdout>,
}

impl Holder {
    pub fn pid(&self) -> u32 {
        field(&self.lines[0], "pid").expect("pid line") as u32
    }

    /// Closes stdin so `hold` returns, and waits.
    pub fn release(mut self) {
        if let Some(mut stdin) = self.child.stdin.take() {
            let _ = stdin.flush();
        }
        let status = self.child.wait().expect("wait");
        assert!(status.success());
    }

    /// SIGKILL and reap.
    pub fn kill9(mut self) {
        self.child.kill().expect("kill");
        let _ = self.child.wait();
    }
}

/// Value of `key=` in a line, as a number (decimal or 0x-hex).
pub fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace().find_map(|tok| {
        let v = tok.strip_prefix(key)?.strip_prefix('=')?;
        match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).ok(),
            None => v.parse().ok(),
        }
    })
}

/// The first line starting with `prefix`.
pub fn line<'a>(lines: &'a [String], prefix: &str) -> &'a str {
    lines
        .iter()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in {lines:?}"))
}

/// `free=` of the `info` line.
pub fn info_free(lines: &[String]) -> u64 {
    field(line(lines, "info "), "free").expect("free=")
}
