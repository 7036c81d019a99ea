//! The CDI spec fgpu writes (Container Device Interface, cncf-tags/container-device-interface
//! SPEC.md): the data types of the parts it uses, and the spec built from what
//! [`super::generate`] found on the node. Pure: no I/O.
//!
//! Version: `cdiVersion` 0.5.0, the newest that podman 4.3 (Debian 12's) accepts — it
//! silently drops a spec of 0.6.0 ("unresolvable CDI devices"), checked here with podman
//! 4.3.1. Every field used (env, deviceNodes, mounts, hooks) exists since 0.3.0, so newer
//! runtimes (docker 28, containerd 1.7/2.x, CRI-O, podman 5) take it as it is.

use serde::{Deserialize, Serialize};

pub const CDI_VERSION: &str = "0.5.0";
pub const DEFAULT_KIND: &str = "fgpu.io/gpu";
/// Where the shim appears inside containers.
pub const SHIM_IN_CONTAINER: &str = "/usr/local/lib/fgpu/libfgpu.so";
/// Where the directory of the containers' socket appears inside containers (the shim's
/// default `FGPU_SOCKET` is `/run/fgpu/fgpu.sock`).
pub const SOCKET_DIR_IN_CONTAINER: &str = "/run/fgpu";
/// The node spec's devices that fgpu's device plugin hands out beside a GPU: each adds the
/// hook once more, marked with what was granted (`fgpu cdi hook --granted memory`), which the
/// hook reads back from config.json, where a container cannot write (cdi/hook.rs).
pub const GRANT_DEVICES: [(&str, &str); 2] = [
    ("device-plugin-memory", "memory"),
    ("device-plugin-compute", "compute"),
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<Device>,
    pub container_edits: Edits,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    pub container_edits: Edits,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Edits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    pub options: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    pub hook_name: String,
    pub path: String,
    pub args: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u32>,
}

/// One GPU, as NVML lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    /// `/dev/nvidia<minor>`.
    pub minor: u32,
}

/// How the shim is loaded in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Preload {
    /// `LD_PRELOAD=<shim>` (replaces an image's own LD_PRELOAD).
    Env,
    /// This host file (holding the shim's container path) mounted at /etc/ld.so.preload:
    /// also covers processes started with a cleared environment.
    File(String),
}

/// The NVIDIA driver's parts to inject, when NVIDIA's own CDI spec does not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Nvidia {
    /// Control nodes (`/dev/nvidiactl`, `/dev/nvidia-uvm`, ...) that exist on the host.
    pub control_nodes: Vec<String>,
    /// Driver libraries and tools: (host path, container path).
    pub files: Vec<(String, String)>,
}

/// Everything the spec is made from.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub kind: String,
    pub gpus: Vec<Gpu>,
    /// libfgpu.so on the host.
    pub shim: String,
    /// The containers' socket on the host (its directory is mounted, never the admin one).
    pub socket: String,
    pub preload: Preload,
    /// The hook: the `fgpu` binary on the host and the arguments after `fgpu cdi hook`.
    pub fgpu: String,
    pub hook_args: Vec<String>,
    pub nvidia: Option<Nvidia>,
}

/// Checks a CDI kind (`vendor/class`) by the spec's rules for names.
pub fn check_kind(kind: &str) -> Result<(), String> {
    let (vendor, class) = kind
        .split_once('/')
        .ok_or_else(|| format!("--kind {kind}: a CDI kind is VENDOR/CLASS, e.g. fgpu.io/gpu"))?;
    let alnum = |c: u8| c.is_ascii_alphanumeric();
    let ok_vendor = vendor.len() >= 2
        && vendor.as_bytes()[0].is_ascii_alphabetic()
        && alnum(vendor.as_bytes()[vendor.len() - 1])
        && vendor.bytes().all(|c| alnum(c) || b"-_.".contains(&c));
    let ok_class = !class.is_empty()
        && class.as_bytes()[0].is_ascii_alphabetic()
        && alnum(class.as_bytes()[class.len() - 1])
        && class.bytes().all(|c| alnum(c) || b"-_".contains(&c));
    if !ok_vendor || !ok_class {
        return Err(format!(
            "--kind {kind}: the vendor takes letters, digits, '.', '-' and '_' and the class \
             letters, digits, '-' and '_', each starting with a letter and ending with a letter \
             or digit"
        ));
    }
    Ok(())
}

/// The createRuntime hook: `fgpu cdi hook`, the node's hook arguments, then `extra`.
fn hook(inputs: &Inputs, extra: &[&str]) -> Hook {
    Hook {
        hook_name: "createRuntime".into(),
        path: inputs.fgpu.clone(),
        args: ["fgpu", "cdi", "hook"]
            .iter()
            .map(|s| s.to_string())
            .chain(inputs.hook_args.iter().cloned())
            .chain(extra.iter().map(|s| s.to_string()))
            .collect(),
        timeout: Some(15),
    }
}

/// The spec: devices `all`, one per GPU index and one per UUID, and the device plugin's
/// [`GRANT_DEVICES`]; the shim, the containers'
/// socket directory and the hook in the spec-wide edits (applied once, whichever devices).
pub fn build(inputs: &Inputs) -> Spec {
    let socket_name = std::path::Path::new(&inputs.socket)
        .file_name()
        .map_or("fgpu.sock".into(), |n| n.to_string_lossy().into_owned());
    let socket_dir = std::path::Path::new(&inputs.socket)
        .parent()
        .map_or("/run/fgpu".into(), |d| d.display().to_string());
    let ro = |extra: &[&str]| -> Vec<String> {
        ["ro", "nosuid", "nodev", "rbind"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect()
    };
    let mut common = Edits {
        env: vec![format!(
            "FGPU_SOCKET={SOCKET_DIR_IN_CONTAINER}/{socket_name}"
        )],
        mounts: vec![
            Mount {
                host_path: inputs.shim.clone(),
                container_path: SHIM_IN_CONTAINER.into(),
                options: ro(&[]),
            },
            Mount {
                host_path: socket_dir,
                container_path: SOCKET_DIR_IN_CONTAINER.into(),
                options: ro(&["noexec"]),
            },
        ],
        hooks: vec![hook(inputs, &[])],
        ..Edits::default()
    };
    match &inputs.preload {
        Preload::Env => common.env.push(format!("LD_PRELOAD={SHIM_IN_CONTAINER}")),
        Preload::File(host) => common.mounts.push(Mount {
            host_path: host.clone(),
            container_path: "/etc/ld.so.preload".into(),
            options: ro(&[]),
        }),
    }
    if let Some(nv) = &inputs.nvidia {
        common.device_nodes = nv
            .control_nodes
            .iter()
            .map(|p| DeviceNode { path: p.clone() })
            .collect();
        common.mounts.extend(nv.files.iter().map(|(h, c)| Mount {
            host_path: h.clone(),
            container_path: c.clone(),
            options: ro(&[]),
        }));
    }
    let node = |g: &Gpu| DeviceNode {
        path: format!("/dev/nvidia{}", g.minor),
    };
    // Every device needs an edit of its own (an empty device is invalid CDI): which GPUs
    // the container was given, for people and tools inside; and with --nvidia its node.
    let device = |name: String, gpus: &[&Gpu]| Device {
        name,
        container_edits: Edits {
            env: vec![format!(
                "FGPU_CDI_GPUS={}",
                gpus.iter()
                    .map(|g| g.uuid.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            )],
            device_nodes: if inputs.nvidia.is_some() {
                gpus.iter().map(|g| node(g)).collect()
            } else {
                Vec::new()
            },
            ..Edits::default()
        },
    };
    let all: Vec<&Gpu> = inputs.gpus.iter().collect();
    let mut devices = vec![device("all".into(), &all)];
    if all.is_empty() {
        devices[0].container_edits.env = vec!["FGPU_CDI_GPUS=all".into()];
    }
    for g in &inputs.gpus {
        devices.push(device(g.index.to_string(), &[g]));
        devices.push(device(g.uuid.clone(), &[g]));
    }
    for (name, what) in GRANT_DEVICES {
        devices.push(Device {
            name: name.into(),
            container_edits: Edits {
                hooks: vec![hook(inputs, &[crate::cdi::hook::GRANTED, what])],
                ..Edits::default()
            },
        });
    }
    Spec {
        cdi_version: CDI_VERSION.into(),
        kind: inputs.kind.clone(),
        devices,
        container_edits: common,
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    pub fn inputs() -> Inputs {
        Inputs {
            kind: DEFAULT_KIND.into(),
            gpus: vec![
                Gpu {
                    index: 0,
                    uuid: "GPU-6b9a4a5e-0000-4000-8000-000000000000".into(),
                    minor: 0,
                },
                Gpu {
                    index: 1,
                    uuid: "GPU-6b9a4a5e-0000-4000-8000-000000000001".into(),
                    minor: 3,
                },
            ],
            shim: "/usr/lib/fgpu/libfgpu.so".into(),
            socket: "/run/fgpu/fgpu.sock".into(),
            preload: Preload::Env,
            fgpu: "/usr/bin/fgpu".into(),
            hook_args: vec!["--admin-socket".into(), "/run/fgpu-admin/fgpu.sock".into()],
            nvidia: None,
        }
    }

    #[test]
    fn devices_by_index_uuid_and_all_and_the_shared_edits() {
        let spec = build(&inputs());
        let names: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "all",
                "0",
                "GPU-6b9a4a5e-0000-4000-8000-000000000000",
                "1",
                "GPU-6b9a4a5e-0000-4000-8000-000000000001",
                "device-plugin-memory",
                "device-plugin-compute"
            ]
        );
        // A grant device's only edit: the hook again, marked with what was granted.
        let grant = &spec.devices[5].container_edits;
        assert_eq!(grant.hooks.len(), 1);
        assert_eq!(grant.hooks[0].args[..3], ["fgpu", "cdi", "hook"]);
        assert_eq!(
            grant.hooks[0].args[grant.hooks[0].args.len() - 2..],
            ["--granted", "memory"]
        );
        assert!(grant.env.is_empty() && grant.device_nodes.is_empty() && grant.mounts.is_empty());
        let e = &spec.container_edits;
        assert!(e.env.contains(&format!("LD_PRELOAD={SHIM_IN_CONTAINER}")));
        assert!(
            e.env
                .contains(&"FGPU_SOCKET=/run/fgpu/fgpu.sock".to_string())
        );
        let mounts: Vec<(&str, &str)> = e
            .mounts
            .iter()
            .map(|m| (m.host_path.as_str(), m.container_path.as_str()))
            .collect();
        assert_eq!(
            mounts,
            [
                ("/usr/lib/fgpu/libfgpu.so", SHIM_IN_CONTAINER),
                ("/run/fgpu", "/run/fgpu")
            ],
            "the containers' socket directory only, never the admin one"
        );
        assert!(e.mounts.iter().all(|m| m.options.contains(&"ro".into())));
        assert_eq!(e.hooks[0].hook_name, "createRuntime");
        assert_eq!(
            e.hooks[0].args[..3],
            ["fgpu", "cdi", "hook"].map(String::from)
        );
        assert!(e.device_nodes.is_empty(), "no NVIDIA nodes unless asked");
        assert!(
            spec.devices
                .iter()
                .all(|d| d.container_edits.device_nodes.is_empty())
        );
    }

    #[test]
    fn nvidia_parts_and_ld_so_preload_when_asked() {
        let mut i = inputs();
        i.preload = Preload::File("/etc/fgpu/ld.so.preload".into());
        i.nvidia = Some(Nvidia {
            control_nodes: vec!["/dev/nvidiactl".into(), "/dev/nvidia-uvm".into()],
            files: vec![(
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                "/usr/local/nvidia/lib64/libcuda.so.1".into(),
            )],
        });
        let spec = build(&i);
        let e = &spec.container_edits;
        assert!(!e.env.iter().any(|v| v.starts_with("LD_PRELOAD=")));
        assert!(
            e.mounts
                .iter()
                .any(|m| m.container_path == "/etc/ld.so.preload")
        );
        assert_eq!(e.device_nodes.len(), 2);
        let one = spec.devices.iter().find(|d| d.name == "1").unwrap();
        assert_eq!(one.container_edits.device_nodes[0].path, "/dev/nvidia3");
        let all = &spec.devices[0];
        assert_eq!(all.container_edits.device_nodes.len(), 2);
    }

    #[test]
    fn kinds() {
        assert!(check_kind("fgpu.io/gpu").is_ok());
        assert!(check_kind("test-1.fgpu.io/gpu").is_ok());
        for bad in [
            "fgpu.io",
            "/gpu",
            "fgpu.io/",
            "fgpu.io/g/x",
            "-x.io/gpu",
            "f/gpu",
        ] {
            assert!(check_kind(bad).is_err(), "{bad}");
        }
    }
}
