//! `fgpu cdi generate` output checked by the CDI project's own Rust library
//! (crates.io `container-device-interface`): its JSON schema and its spec rules (version,
//! vendor and class names, device names, every container edit, hook names). Podman's
//! acceptance is checked in `e2e_containers.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;

use container_device_interface::spec::read_spec;
use container_device_interface::version::{VersionWrapper, minimum_required_version};

fn sim_dir() -> PathBuf {
    std::env::var_os("FGPU_SIM_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/sim"),
        PathBuf::from,
    )
}

fn generate(dir: &Path, extra: &[&str]) -> (PathBuf, serde_json::Value) {
    let out = dir.join("fgpu.json");
    let run = Command::new(env!("CARGO_BIN_EXE_fgpu"))
        .args(["cdi", "generate", "--sim", "--output"])
        .arg(&out)
        .args(["--socket", "/run/fgpu/fgpu.sock"])
        .args(["--admin-socket", "/run/fgpu-admin/fgpu.sock"])
        .args(["--shim", env!("CARGO_BIN_EXE_fgpu")]) // any existing file
        .args(extra)
        .env("FGPU_SIM_DIR", sim_dir())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let json = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    (out, json)
}

fn validate(path: &Path) -> anyhow::Result<usize> {
    let mut spec = read_spec(&path.to_path_buf(), 0)?;
    Ok(spec.validate()?.len())
}

#[test]
fn the_generated_spec_is_valid_cdi_of_a_version_podman_4_3_takes() {
    if !sim_dir().join("libnvidia-ml.so.1").is_file() {
        panic!("the simulated driver is not installed: run `cargo xtask build`");
    }
    let dir = std::env::temp_dir().join(format!("fgpu-cdi-spec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for extra in [
        &[][..],
        &[
            "--nvidia",
            "--max-memory",
            "40GiB",
            "--default-memory",
            "8GiB",
            "--max-compute",
            "90",
        ][..],
        &[
            "--ld-so-preload",
            dir.join("ld.so.preload").to_str().unwrap(),
        ][..],
    ] {
        let (path, json) = generate(&dir, extra);
        // The simulated driver has one GPU: all, 0 and its UUID; and the device plugin's
        // two grant devices (the hook alone).
        let devices = validate(&path).unwrap_or_else(|e| panic!("{extra:?}: {e:#}\n{json:#}"));
        assert_eq!(devices, 5, "{json:#}");
        let spec: container_device_interface::specs::config::Spec =
            serde_json::from_value(json.clone()).unwrap();
        let needed = minimum_required_version(&spec).unwrap();
        assert!(
            !needed.is_greater_than(&VersionWrapper::new("0.5.0")),
            "needs CDI {needed}, newer than podman 4.3 takes"
        );
        assert_eq!(json["cdiVersion"], "0.5.0");
        assert_eq!(json["kind"], "fgpu.io/gpu");
        let hook = &json["containerEdits"]["hooks"][0];
        assert_eq!(hook["hookName"], "createRuntime");
        let args: Vec<&str> = hook["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(
            &args[..5],
            [
                "fgpu",
                "cdi",
                "hook",
                "--admin-socket",
                "/run/fgpu-admin/fgpu.sock"
            ]
        );
        if extra.contains(&"--max-compute") {
            assert!(
                args.windows(2).any(|w| w == ["--max-compute", "90"]),
                "{args:?}"
            );
        }
        let mounts = json["containerEdits"]["mounts"].as_array().unwrap();
        assert!(
            mounts
                .iter()
                .all(|m| !m["hostPath"].as_str().unwrap().contains("fgpu-admin")),
            "never the admin socket's directory: {mounts:?}"
        );
    }
    // The validator is not a rubber stamp: a wrong hook name and a bad device name fail.
    let (path, json) = generate(&dir, &[]);
    for (field, value) in [
        ("/containerEdits/hooks/0/hookName", "createRuntimeX"),
        ("/devices/1/name", "0/../x"),
        ("/kind", "fgpu.io"),
    ] {
        let mut bad = json.clone();
        *bad.pointer_mut(field).unwrap() = value.into();
        std::fs::write(&path, serde_json::to_vec(&bad).unwrap()).unwrap();
        assert!(validate(&path).is_err(), "{field}={value} was accepted");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_options_say_what_is_wrong() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_fgpu"))
            .args(["cdi", "generate", "--sim"])
            .args(args)
            .env("FGPU_SIM_DIR", sim_dir())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&["--kind", "nope", "--shim", "/bin/sh"]);
    assert!(err.contains("VENDOR/CLASS"), "{err}");
    let err = run(&[
        "--socket",
        "/run/x/a.sock",
        "--admin-socket",
        "/run/x/b.sock",
        "--shim",
        "/bin/sh",
    ]);
    assert!(err.contains("in one directory"), "{err}");
    let err = run(&["--shim", "/nonexistent/libfgpu.so"]);
    assert!(err.contains("no such file"), "{err}");
}

#[test]
fn the_hook_without_an_agent_refuses_unless_allowed_and_passes_containers_that_ask_nothing() {
    let dir = std::env::temp_dir().join(format!("fgpu-cdi-hook-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = format!(
        r#"{{"ociVersion":"1.0.2","id":"0123456789abcdef","status":"creating","pid":{},"bundle":"{}"}}"#,
        std::process::id(),
        dir.display()
    );
    let hook = |env: &str, extra: &[&str]| {
        std::fs::write(
            dir.join("config.json"),
            format!(r#"{{"ociVersion":"1.0.2","process":{{"env":["PATH=/bin"{env}]}}}}"#),
        )
        .unwrap();
        run_hook(&dir, &state, extra)
    };
    let (ok, err) = hook(r#","FGPU_MEMORY_LIMIT=1GiB""#, &[]);
    assert!(!ok, "started without an agent");
    assert!(
        err.contains("container 0123456789ab")
            && err.contains("refused")
            && err.contains("not running"),
        "{err}"
    );
    let (ok, err) = hook(r#","FGPU_MEMORY_LIMIT=1GiB""#, &["--allow-without-agent"]);
    assert!(
        ok && err.contains("warning") && err.contains("on its own"),
        "{err}"
    );
    let (ok, err) = hook("", &[]);
    assert!(ok, "a container asking for nothing needs no agent: {err}");
    let (ok, err) = hook("", &["--default-memory", "4GiB"]);
    assert!(
        !ok && err.contains("memory 4GiB"),
        "the default is a limit to hold: {err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The hook run as a runtime runs it, on a config.json whose environment repeats one of
/// fgpu's variables (a device plugin's value and the container's own: runc keeps the last,
/// getenv the first, and containerd puts an image's ENV first): refused, naming the variable,
/// before any agent is asked.
#[test]
fn the_hook_refuses_a_container_that_repeats_one_of_fgpus_variables() {
    let dir = std::env::temp_dir().join(format!("fgpu-cdi-hook-dup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = format!(
        r#"{{"ociVersion":"1.0.2","id":"0123456789abcdef","status":"creating","pid":{},"bundle":"{}"}}"#,
        std::process::id(),
        dir.display()
    );
    for (env, name) in [
        (
            r#""FGPU_COMPUTE_SHARE=99","PATH=/bin","FGPU_MEMORY_LIMIT=1GiB","FGPU_COMPUTE_SHARE=10""#,
            "FGPU_COMPUTE_SHARE",
        ),
        (
            r#""FGPU_MEMORY_LIMIT=1GiB","FGPU_MEMORY_LIMIT=40GiB""#,
            "FGPU_MEMORY_LIMIT",
        ),
        (
            r#""FGPU_PARK_AFTER=1h","FGPU_PARK_AFTER=1s""#,
            "FGPU_PARK_AFTER",
        ),
    ] {
        std::fs::write(
            dir.join("config.json"),
            format!(r#"{{"ociVersion":"1.0.2","process":{{"env":[{env}]}}}}"#),
        )
        .unwrap();
        let (ok, err) = run_hook(&dir, &state, &["--allow-without-agent"]);
        assert!(!ok, "{env}: the container was let start");
        assert!(
            err.contains(&format!("{name} is set 2 times")) && err.contains("refused"),
            "{env}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `fgpu cdi hook` as a runtime runs it: the OCI state on stdin, its bundle `dir` (which holds
/// the config.json), no agent at `dir/no-agent.sock`; whether it let the container start,
/// and what it said.
fn run_hook(dir: &std::path::Path, state: &str, extra: &[&str]) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_fgpu"))
        .args(["cdi", "hook", "--admin-socket"])
        .arg(dir.join("no-agent.sock"))
        .args(extra)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(state.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
