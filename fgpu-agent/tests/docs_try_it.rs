//! docs/containers.md, "Try it in a container without a GPU", run as written (issue 28): the
//! ```sh blocks between `<!-- try-it:begin -->` and `<!-- try-it:end -->` are taken from the
//! document, joined in order and run by one `bash -euo pipefail` as root, so that the
//! walk-through cannot drift from what works.
//!
//! They run in a working directory of the test's own whose `target/debug` is the build that
//! cargo made for this test (CI's `cargo build --workspace`; nothing is built or downloaded
//! here), with `FGPU_TRY` naming a directory of the test's own: the agent's sockets, state and
//! bpffs directory, the container's name and the CDI spec's file all follow from it, so that
//! the run clashes with no other test. The test checks what the walk-through promises: the
//! container's total of 1 GiB (cuMemGetInfo and NVML, exact bytes), the allocation past it
//! refused with CUDA_ERROR_OUT_OF_MEMORY, the container and its 1 GiB limit in `fgpu status`
//! and `fgpu top --once`; and that its clean-up left nothing behind: no agent, no container,
//! no spec, no bpffs directory, no files.

mod common;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{privileged, unique};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const BEGIN: &str = "<!-- try-it:begin -->";
const END: &str = "<!-- try-it:end -->";
/// The whole walk-through's bound (its own waits are 30 s each; it takes seconds).
const LIMIT: Duration = Duration::from_secs(120);

fn doc() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/containers.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The ```sh blocks between the markers, in order (other fences, e.g. ```text, are skipped).
fn try_it_blocks(doc: &str) -> Vec<String> {
    assert_eq!(doc.matches(BEGIN).count(), 1, "one {BEGIN} in the document");
    assert_eq!(doc.matches(END).count(), 1, "one {END} in the document");
    let start = doc.find(BEGIN).unwrap() + BEGIN.len();
    let section = &doc[start..doc.find(END).expect("the end marker")];
    let mut blocks = Vec::new();
    // Inside a fence: Some(true) for a ```sh block (collected), Some(false) for another.
    let mut fence: Option<bool> = None;
    let mut block = String::new();
    for line in section.lines() {
        let trimmed = line.trim_end();
        match fence {
            None if trimmed.starts_with("```") => {
                fence = Some(trimmed == "```sh");
            }
            None => {}
            Some(sh) if trimmed == "```" => {
                if sh {
                    blocks.push(std::mem::take(&mut block));
                }
                fence = None;
            }
            Some(true) => {
                block.push_str(line);
                block.push('\n');
            }
            Some(false) => {}
        }
    }
    assert!(
        fence.is_none(),
        "a fence in the try-it section is not closed"
    );
    blocks
}

#[test]
fn the_try_it_blocks_are_found_in_order() {
    let sample = "```sh\nnot this\n```\n<!-- try-it:begin -->\ntext\n```sh\na\nb\n```\n\n\
               ```text\n```sh is output here\n```\n```sh\nc\n```\n<!-- try-it:end -->\n\
               ```sh\nnor this\n```\n";
    assert_eq!(try_it_blocks(sample), ["a\nb\n", "c\n"]);
    // The document's own section: the steps this test checks are there, in this order.
    let script = try_it_blocks(&doc()).concat();
    let mut at = 0;
    for step in [
        "fgpu agent --sim",
        "fgpu cdi generate --sim",
        "--device fgpu.io/gpu=0 -e FGPU_MEMORY_LIMIT=1GiB",
        "fgpu status",
        "fgpu top --once",
        "podman rm",
        "kill ",
    ] {
        let found = script[at..].find(step).unwrap_or_else(|| {
            panic!("the try-it section lacks `{step}` (after byte {at}):\n{script}")
        });
        at += found + step.len();
    }
}

/// `fgpu-sim-load --error-names`, which the walk-through uses, names a failure's code; without
/// it the line is what the other tests expect, to the byte.
#[test]
fn the_load_tool_names_the_error_only_when_asked() {
    let sim = common::sim_dir();
    let state = std::env::temp_dir().join(unique("fgpu-try-sim-state"));
    let run = |extra: &[&str]| {
        let out = Command::new(sim.join("fgpu-sim-load"))
            .arg("--lib")
            .arg(sim.join("libcuda.so.1"))
            .args(extra)
            .args(["alloc", "20GiB"])
            .env("FGPU_SIM_STATE", &state)
            .env_remove("LD_PRELOAD")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find(|l| l.starts_with("alloc "))
            .unwrap_or_else(|| panic!("no alloc line: {text}"))
            .to_string()
    };
    let named = run(&["--error-names"]);
    let plain = run(&[]);
    let _ = std::fs::remove_file(&state);
    assert_eq!(
        named,
        "alloc fail rc=2 size=21474836480 api=mem_alloc error=CUDA_ERROR_OUT_OF_MEMORY"
    );
    assert_eq!(plain, "alloc fail rc=2 size=21474836480 api=mem_alloc");
}

/// Processes whose command line has `arg` (the agent, by its `--state-dir`).
fn processes_with(arg: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if cmdline.split(|&b| b == 0).any(|a| a == arg.as_bytes()) {
            pids.push(pid);
        }
    }
    pids
}

/// What the walk-through makes, removed on drop whatever the walk-through did (a failed run
/// leaves its agent, container and spec behind).
struct Walk {
    /// The working directory: `target/debug` in it is this build.
    cwd: PathBuf,
    /// `$FGPU_TRY`, and its name (`$name` in the document).
    try_dir: PathBuf,
    name: String,
}

impl Walk {
    fn new() -> Self {
        let debug = Path::new(env!("CARGO_BIN_EXE_fgpu")).parent().unwrap();
        for f in ["fgpu", "libfgpu.so", "libfgpu_sim.so", "fgpu-sim-load"] {
            assert!(
                debug.join(f).is_file(),
                "{} is missing: build the workspace first (`cargo build --workspace`, as \
                 `cargo xtask test` and CI do)",
                debug.join(f).display()
            );
        }
        let cwd = std::env::temp_dir().join(unique("fgpu-try-cwd"));
        std::fs::create_dir_all(cwd.join("target")).unwrap();
        std::os::unix::fs::symlink(debug, cwd.join("target/debug")).unwrap();
        // podman's settings for the test's own podman commands (the document's are removed
        // with its directory): the same as the document's.
        std::fs::write(
            cwd.join("containers.conf"),
            "[containers]\ndefault_ulimits = []\n[engine]\nruntime = \"runc\"\n\
             cgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n",
        )
        .unwrap();
        let name = unique("fgpu-try");
        Self {
            try_dir: std::env::temp_dir().join(&name),
            cwd,
            name,
        }
    }

    fn agent_pids(&self) -> Vec<i32> {
        processes_with(&format!("{}/state", self.try_dir.display()))
    }

    fn podman(&self) -> Command {
        let mut c = Command::new("podman");
        c.env("CONTAINERS_CONF", self.cwd.join("containers.conf"));
        c
    }

    /// Containers of this name, in any state.
    fn containers(&self) -> String {
        let out = self
            .podman()
            .args(["ps", "-a", "--format", "{{.Names}}", "--filter"])
            .arg(format!("name=^{}$", self.name))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "podman ps: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn spec(&self) -> PathBuf {
        PathBuf::from(format!("/var/run/cdi/{}.json", self.name))
    }

    fn bpf_dir(&self) -> PathBuf {
        Path::new("/sys/fs/bpf").join(&self.name)
    }

    /// Runs `script` with `bash -euo pipefail -x` in the working directory: (exit code,
    /// stdout, stderr, seconds).
    fn run(&self, script: &str) -> (Option<i32>, String, String, f64) {
        let t0 = Instant::now();
        let mut child = Command::new("bash")
            .args(["-euo", "pipefail", "-x", "-c", script])
            .current_dir(&self.cwd)
            .env("FGPU_TRY", &self.try_dir)
            // The document sets what it needs; nothing of the caller's may steer it.
            .env_remove("CONTAINERS_CONF")
            .env_remove("FGPU_SOCKET")
            .env_remove("FGPU_ADMIN_SOCKET")
            .env_remove("FGPU_SIM_DIR")
            .env_remove("FGPU_SIM_STATE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // A group of its own: a walk-through past its bound is killed whole.
            .process_group(0)
            .spawn()
            .expect("starting bash");
        let reader = |mut r: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = r.read_to_string(&mut s);
                s
            })
        };
        let out = reader(Box::new(child.stdout.take().unwrap()));
        let err = reader(Box::new(child.stderr.take().unwrap()));
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if t0.elapsed() > LIMIT {
                // SAFETY: kill(2) of the process group this test started.
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                break child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        (
            status.code(),
            out.join().unwrap(),
            err.join().unwrap(),
            t0.elapsed().as_secs_f64(),
        )
    }
}

impl Drop for Walk {
    fn drop(&mut self) {
        for pid in self.agent_pids() {
            // SAFETY: kill(2) of the agent this walk-through started (found by its state dir).
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.agent_pids().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        for pid in self.agent_pids() {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = self
            .podman()
            .args(["rm", "-f", "-t", "0", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_file(self.spec());
        // Unpinning detaches the probes the agent left attached.
        let _ = std::fs::remove_dir_all(self.bpf_dir());
        let _ = std::fs::remove_dir_all(&self.try_dir);
        let _ = std::fs::remove_dir_all(&self.cwd);
    }
}

/// `key=value` of a line's words.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// The value of `column` in a `row`.
fn cell<'a>(row: &[(&str, &'a str)], column: &str) -> Option<&'a str> {
    row.iter().find(|(n, _)| *n == column).map(|(_, v)| *v)
}

/// The row of `table` (in the lines after the header line starting with `header`) whose `column`
/// is `value`, as column name → value (the columns hold no spaces).
fn row<'a>(
    table: &'a str,
    header: &str,
    column: &str,
    value: &str,
) -> Option<Vec<(&'a str, &'a str)>> {
    let mut lines = table.lines().skip_while(|l| !l.starts_with(header));
    let names: Vec<&str> = lines.next()?.split_whitespace().collect();
    let at = names.iter().position(|n| *n == column)?;
    lines.take_while(|l| !l.trim().is_empty()).find_map(|l| {
        let cells: Vec<&str> = l.split_whitespace().collect();
        (cells.get(at) == Some(&value)).then(|| names.iter().copied().zip(cells).collect())
    })
}

#[test]
fn privileged_the_containers_try_it_walk_through_runs_as_written() {
    if !privileged() {
        return;
    }
    for tool in ["podman", "runc", "ldd"] {
        let ok = Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            ok,
            "{tool} is not installed: `apt-get install -y podman runc` (.ci/run does)"
        );
    }
    let blocks = try_it_blocks(&doc());
    assert!(blocks.len() >= 5, "too few try-it blocks: {blocks:?}");
    let walk = Walk::new();
    let (code, out, err, secs) = walk.run(&blocks.concat());
    let log = std::fs::read_to_string(walk.try_dir.join("agent.log")).unwrap_or_default();
    let context = format!(
        "\n--- stdout ---\n{out}\n--- stderr (bash -x) ---\n{err}\n--- agent log (if left) ---\n{log}"
    );
    assert_eq!(
        code,
        Some(0),
        "the try-it commands of docs/containers.md failed after {secs:.1} s{context}"
    );

    // The container: the id podman printed, what it was told, what it was refused.
    let id = out
        .lines()
        .find(|l| l.len() == 64 && l.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_else(|| panic!("no container id from `podman run -d`{context}"));
    let line = |prefix: &str| {
        out.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` line in the container's output{context}"))
    };
    let info = line("info ");
    assert_eq!(
        field(info, "total"),
        Some(GIB.to_string().as_str()),
        "{info}"
    );
    assert_eq!(
        field(info, "free"),
        Some((GIB - 300 * MIB).to_string().as_str()),
        "{info}: the doc says 300 MiB are the context's"
    );
    let nvml = line("nvml device=0 ");
    assert_eq!(
        field(nvml, "total"),
        Some(GIB.to_string().as_str()),
        "{nvml}"
    );
    let allocs: Vec<&str> = out.lines().filter(|l| l.starts_with("alloc ")).collect();
    assert_eq!(allocs.len(), 3, "{allocs:?}{context}");
    assert!(
        allocs[..2].iter().all(|l| l.starts_with("alloc ok ")),
        "{allocs:?}"
    );
    assert_eq!(
        allocs[2],
        "alloc fail rc=2 size=268435456 api=mem_alloc error=CUDA_ERROR_OUT_OF_MEMORY"
    );
    assert!(
        err.contains("fgpu: cuMemAlloc_v2 of 256MiB denied on device 0: limit 1GiB"),
        "the shim's reason on stderr{context}"
    );

    // The host's views: the container's row, by its short id, with its 1 GiB limit.
    let short = &id[..12];
    let status = row(&out, "CGROUP ", "CONTAINER", short)
        .unwrap_or_else(|| panic!("`fgpu status` has no row for container {short}{context}"));
    assert_eq!(cell(&status, "LIMIT"), Some("1GiB"), "{status:?}");
    // The shim's refusal, in its ledger (read when asked: no race with the kernel's events).
    assert_eq!(cell(&status, "DENIED*"), Some("1"), "{status:?}");
    assert!(
        cell(&status, "CGROUP").is_some_and(|c| c.ends_with(&format!("libpod-{id}"))),
        "{status:?}"
    );
    let top = out
        .split("fgpu top - ")
        .nth(1)
        .unwrap_or_else(|| panic!("no frame from `fgpu top --once`{context}"));
    let top_row = top
        .lines()
        .find(|l| l.contains(&format!("libpod-{short}")))
        .unwrap_or_else(|| panic!("`fgpu top --once` has no row for {short}:\n{top}"));
    assert!(top_row.split_whitespace().any(|w| w == "1GiB"), "{top_row}");

    // Cleaned up, by the document's own commands.
    assert_eq!(walk.agent_pids(), Vec::<i32>::new(), "the agent still runs");
    assert_eq!(walk.containers(), "", "the container is left");
    assert!(!walk.spec().exists(), "the CDI spec is left");
    assert!(
        !walk.bpf_dir().exists(),
        "the agent's bpffs directory is left"
    );
    assert!(!walk.try_dir.exists(), "{} is left", walk.try_dir.display());
    eprintln!(
        "docs/containers.md try-it: {} blocks in {secs:.1} s",
        blocks.len()
    );
}
