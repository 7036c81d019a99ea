//! The driver: the libraries the agent would probe, found by the agent's own search
//! (`agent::discovery`, `agent::sim_dir`), the probe symbols each exports, and NVML.

use std::path::{Path, PathBuf};

use fgpu_common::event::{ApiId, Driver};
use fgpu_common::quantity::Size;

use super::{Check, Paths, elf};
use crate::agent::discovery::{self, Dedup, LIBCUDA};

/// A driver library the agent would try to probe, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub path: PathBuf,
    pub driver: Driver,
    pub source: Source,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `--libcuda`: the agent stops if it cannot probe it.
    Flag,
    /// The simulated CUDA driver: the agent stops if it cannot probe it.
    Sim,
    /// The simulated HIP runtime: skipped with a warning if it cannot be probed.
    SimHip,
    /// Installed on the host (ldconfig cache, library directories): skipped if unprobeable.
    Installed,
    /// Mapped by a running process (a container's own copy): skipped if unprobeable.
    Mapped,
}

impl Source {
    fn words(self) -> &'static str {
        match self {
            Self::Flag => "--libcuda",
            Self::Sim => "simulated",
            Self::SimHip => "simulated",
            Self::Installed => "installed",
            Self::Mapped => "mapped by a running process",
        }
    }

    /// Whether the agent refuses to start when this library cannot be probed.
    fn required(self) -> bool {
        matches!(self, Self::Flag | Self::Sim)
    }
}

/// The libraries `fgpu agent` (with the same `--sim` and `--libcuda`) would try to probe
/// at start, in its order, each file once; or the check that says why there are none.
pub fn search(p: &Paths, libcuda: &[PathBuf]) -> Result<Vec<Found>, Check> {
    let mut candidates = Vec::new();
    for path in libcuda {
        if !path.is_file() {
            return Err(Check::fail(
                "driver-library",
                format!("--libcuda {}: no such file", path.display()),
                "give --libcuda the path of an existing libcuda.so.1 (or leave it out)",
            ));
        }
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let driver = Driver::of_file_name(&name).unwrap_or(Driver::Cuda);
        candidates.push((path.clone(), driver, Source::Flag));
    }
    if p.sim {
        let sim = crate::agent::sim_dir().map_err(|err| {
            Check::fail(
                "driver-library",
                format!("{err:#}"),
                "build and install the simulated driver: `cargo xtask build` (or point \
                 FGPU_SIM_DIR at it)",
            )
        })?;
        candidates.push((sim.join(LIBCUDA), Driver::Cuda, Source::Sim));
        if let Some(hip) = ["libamdhip64.so.7", "libamdhip64.so"]
            .iter()
            .map(|n| sim.join(n))
            .find(|p| p.exists())
        {
            candidates.push((hip, Driver::Hip, Source::SimHip));
        }
    } else {
        let installed = discovery::system_candidates().into_iter();
        candidates.extend(installed.map(|(p, d)| (p, d, Source::Installed)));
    }
    // Then, with --sim too, what running processes have mapped (the agent's first scan).
    let mapped = discovery::mapped_by_all().into_iter();
    candidates.extend(mapped.map(|(p, d)| (p, d, Source::Mapped)));
    let mut dedup = Dedup::default();
    let found: Vec<Found> = candidates
        .into_iter()
        .filter_map(|(path, driver, source)| {
            let lib = dedup.admit(&path, driver)?;
            Some(Found {
                path: lib.path,
                driver,
                source,
            })
        })
        .collect();
    if found.is_empty() {
        return Err(Check::fail(
            "driver-library",
            "no GPU driver library found (libcuda.so.1 or libamdhip64.so; looked in the ldconfig \
             cache, /usr/local/nvidia/lib64, the distribution's library directories and running \
             processes): the agent would not start",
            "install the GPU driver, point at its library with --libcuda PATH, or on a machine \
             without a GPU use the simulated driver (`fgpu agent --sim`, `fgpu doctor --sim`)",
        ));
    }
    Ok(found)
}

/// What a library exports of what the probes attach to.
enum Symbols {
    All(usize),
    Some {
        found: usize,
        missing: Vec<&'static str>,
    },
    None(String),
}

fn symbols(f: &Found) -> Symbols {
    let wanted: Vec<&'static str> = ApiId::of(f.driver)
        .flat_map(|api| api.symbols().iter().copied())
        .collect();
    match elf::defined(&f.path, &wanted) {
        Err(err) => Symbols::None(format!("its symbols cannot be read ({err:#})")),
        Ok(found) if found.is_empty() => Symbols::None(format!(
            "it exports none of the {} entry points the probes attach to ({}, ...)",
            wanted.len(),
            wanted[..2].join(", ")
        )),
        Ok(found) if found.len() == wanted.len() => Symbols::All(found.len()),
        Ok(found) => Symbols::Some {
            found: found.len(),
            missing: wanted.into_iter().filter(|w| !found.contains(w)).collect(),
        },
    }
}

/// One line per library: its probe symbols, and whether the agent could use it.
pub fn libraries(p: &Paths, search: &Result<Vec<Found>, Check>) -> Vec<Check> {
    let found = match search {
        Ok(found) => found,
        Err(check) => return vec![check.clone()],
    };
    let verdicts: Vec<(&Found, Symbols)> = found.iter().map(|f| (f, symbols(f))).collect();
    let any_probeable = verdicts.iter().any(|(_, s)| !matches!(s, Symbols::None(_)));
    verdicts
        .into_iter()
        .map(|(f, s)| {
            let what = format!(
                "{} ({}, {})",
                f.path.display(),
                match f.driver {
                    Driver::Cuda => "CUDA",
                    Driver::Hip => "HIP",
                },
                f.source.words()
            );
            match s {
                Symbols::All(n) => Check::ok(
                    "driver-library",
                    format!("{what}: exports all {n} probe symbols"),
                ),
                Symbols::Some { found, missing } => Check::warn(
                    "driver-library",
                    format!(
                        "{what}: exports {found} of {} probe symbols; allocations through {} \
                         are not counted",
                        found + missing.len(),
                        missing.join(", ")
                    ),
                    "update the driver to a release that exports them",
                ),
                Symbols::None(why) if f.source.required() || !any_probeable => Check::fail(
                    "driver-library",
                    format!("{what}: {why}: the agent would not start"),
                    fix_unprobeable(p),
                ),
                Symbols::None(why) => Check::warn(
                    "driver-library",
                    format!("{what}: {why}: the agent skips it"),
                    "nothing to do if it is not a driver in use; else replace it with the \
                     driver's own library",
                ),
            }
        })
        .collect()
}

fn fix_unprobeable(p: &Paths) -> &'static str {
    if p.sim {
        "rebuild and install the simulated driver: `cargo xtask build`"
    } else {
        "point the agent at the GPU driver's own library (--libcuda PATH), or reinstall the \
         driver"
    }
}

/// NVML, loaded as the agent loads it (`--sim`: the simulated one; `--driver-root`: from
/// its library directories), and the GPUs it lists. Also returns the GPUs' UUIDs when NVML
/// loaded, for the CDI spec's check.
pub fn nvml(p: &Paths, driver_root: Option<&Path>) -> (Check, Option<Vec<String>>) {
    let lib = match (p.sim, driver_root) {
        (true, _) => match crate::agent::sim_dir() {
            Ok(dir) => Some(dir.join("libnvidia-ml.so.1")),
            Err(err) => {
                let fix = "build and install the simulated driver: `cargo xtask build` (or point \
                           FGPU_SIM_DIR at it)";
                return (Check::fail("nvml", format!("{err:#}"), fix), None);
            }
        },
        (false, Some(root)) => match crate::driverroot::nvml_under(root) {
            Ok(lib) => Some(lib),
            Err(err) => {
                let fix = "give --driver-root the root the driver is installed under (the \
                           host's / or the driver container's root)";
                return (Check::warn("nvml", format!("{err:#}"), fix), None);
            }
        },
        (false, None) => None,
    };
    let mut builder = nvml_wrapper::Nvml::builder();
    if let Some(lib) = &lib {
        builder.lib_path(lib.as_os_str());
    }
    let from = lib.as_ref().map_or_else(
        || "libnvidia-ml.so".to_string(),
        |l| l.display().to_string(),
    );
    let nvml = match builder.init() {
        Ok(nvml) => nvml,
        Err(err) if p.sim => {
            return (
                Check::fail(
                    "nvml",
                    format!("the simulated NVML ({from}) does not load: {err}"),
                    "rebuild and install the simulated driver: `cargo xtask build`",
                ),
                None,
            );
        }
        Err(err) => {
            return (
                Check::warn(
                    "nvml",
                    format!(
                        "NVML does not load ({from}: {err}): no GPU is listed; memory is still \
                         attributed, but device sizes, per-GPU limits and compute shares need \
                         it (an AMD node uses ROCm SMI instead)"
                    ),
                    "install the NVIDIA driver (libnvidia-ml.so.1), or give --driver-root DIR \
                     where it is installed",
                ),
                None,
            );
        }
    };
    let version = nvml
        .sys_driver_version()
        .unwrap_or_else(|_| "unknown".into());
    let count = nvml.device_count().unwrap_or(0);
    let mut uuids = Vec::new();
    let mut listed = Vec::new();
    for index in 0..count {
        let Ok(d) = nvml.device_by_index(index) else {
            listed.push(format!("{index} (unreadable)"));
            continue;
        };
        let uuid = d.uuid().unwrap_or_default();
        let memory = d
            .memory_info()
            .map_or_else(|_| "size unknown".into(), |m| Size(m.total).to_string());
        listed.push(format!(
            "{index} {} ({uuid}, {memory})",
            d.name().unwrap_or_default()
        ));
        uuids.push(uuid);
    }
    let check = if count == 0 {
        Check::warn(
            "nvml",
            format!("NVML (driver {version}) lists no GPU"),
            "check that the NVIDIA kernel module is loaded and sees the GPUs (`nvidia-smi`)",
        )
    } else {
        Check::ok(
            "nvml",
            format!(
                "NVML (driver {version}): {count} GPU{}: {}",
                if count == 1 { "" } else { "s" },
                listed.join("; ")
            ),
        )
    };
    (check, Some(uuids))
}

#[cfg(test)]
mod tests {
    use super::super::Status;
    use super::super::elf::tests::tiny_so;
    use super::super::tests::Tree;
    use super::*;

    fn cuda_symbols() -> Vec<&'static str> {
        ApiId::of(Driver::Cuda)
            .flat_map(|a| a.symbols().iter().copied())
            .collect()
    }

    fn found(path: PathBuf, source: Source) -> Found {
        Found {
            path,
            driver: Driver::Cuda,
            source,
        }
    }

    #[test]
    fn a_library_with_every_probe_symbol_is_ok_and_one_missing_some_is_a_warning() {
        let t = Tree::new("driver");
        let all = cuda_symbols();
        let full = t.write("/usr/lib/libcuda.so.1", tiny_so(&all, &[]));
        let old = t.write(
            "/opt/old/libcuda.so.1",
            tiny_so(&all[..2], &["cuMemCreate"]),
        );
        let checks = libraries(
            &t.paths(),
            &Ok(vec![
                found(full.clone(), Source::Installed),
                found(old.clone(), Source::Mapped),
            ]),
        );
        assert_eq!(checks[0].status, Status::Ok);
        assert_eq!(
            checks[0].detail,
            format!(
                "{} (CUDA, installed): exports all {} probe symbols",
                full.display(),
                all.len()
            )
        );
        assert_eq!(checks[1].status, Status::Warn);
        assert!(
            checks[1].detail.starts_with(&format!(
                "{} (CUDA, mapped by a running process): exports 2 of {} probe symbols; \
                 allocations through cuMemAllocManaged, ",
                old.display(),
                all.len()
            )),
            "{}",
            checks[1].detail
        );
        assert_eq!(
            checks[1].fix.as_deref(),
            Some("update the driver to a release that exports them")
        );
    }

    #[test]
    fn an_unprobeable_library_fails_only_when_the_agent_would_stop() {
        let t = Tree::new("driver-none");
        let full = t.write("/usr/lib/libcuda.so.1", tiny_so(&cuda_symbols(), &[]));
        let stub = t.write("/opt/stub/libcuda.so.1", tiny_so(&["cuInit"], &[]));
        let p = t.paths();

        // Beside a good library, an installed stub is skipped by the agent: a warning.
        let both = libraries(
            &p,
            &Ok(vec![
                found(full, Source::Installed),
                found(stub.clone(), Source::Installed),
            ]),
        );
        assert_eq!(both[1].status, Status::Warn);
        assert_eq!(
            both[1].detail,
            format!(
                "{} (CUDA, installed): it exports none of the {} entry points the probes attach \
                 to (cuMemAlloc_v2, cuMemAllocPitch_v2, ...): the agent skips it",
                stub.display(),
                cuda_symbols().len()
            )
        );

        // Alone, or given with --libcuda, it stops the agent: a failure.
        for source in [Source::Installed, Source::Flag] {
            let alone = libraries(&p, &Ok(vec![found(stub.clone(), source)]));
            assert_eq!(alone[0].status, Status::Fail, "{source:?}");
            assert_eq!(
                alone[0].fix.as_deref(),
                Some(
                    "point the agent at the GPU driver's own library (--libcuda PATH), or \
                     reinstall the driver"
                )
            );
        }
    }

    #[test]
    fn a_missing_libcuda_flag_fails_before_anything_is_searched() {
        let t = Tree::new("driver-flag");
        let missing = t.0.join("nowhere/libcuda.so.1");
        let err = search(&t.paths(), std::slice::from_ref(&missing)).unwrap_err();
        assert_eq!(err.status, Status::Fail);
        assert_eq!(
            err.detail,
            format!("--libcuda {}: no such file", missing.display())
        );
        assert_eq!(
            err.fix.as_deref(),
            Some("give --libcuda the path of an existing libcuda.so.1 (or leave it out)")
        );
    }

    #[test]
    fn a_driver_root_without_nvml_is_a_warning_naming_where_it_looked() {
        let t = Tree::new("driver-root");
        let (check, gpus) = nvml(&t.paths(), Some(&t.0));
        assert_eq!(check.status, Status::Warn);
        assert!(
            check
                .detail
                .contains("no libnvidia-ml.so.1 in usr/lib/x86_64-linux-gnu"),
            "{}",
            check.detail
        );
        assert_eq!(
            check.fix.as_deref(),
            Some(
                "give --driver-root the root the driver is installed under (the host's / or \
                 the driver container's root)"
            )
        );
        assert_eq!(gpus, None);
    }
}
