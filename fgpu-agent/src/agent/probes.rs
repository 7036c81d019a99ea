//! Loading fgpu's eBPF object and attaching its programs.

use std::path::Path;

use anyhow::{Context, Result, bail};
use aya::programs::links::FdLink;
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};
use aya::programs::{TracePoint, UProbe};
use aya::{Ebpf, EbpfLoader};
use fgpu_common::event::ApiId;

use super::discovery::Library;
use super::pins::Pins;

/// The loaded object and what it is attached to. Links are pinned (see [`super::pins`]):
/// they stay attached when the agent exits, until the next agent retires them.
pub struct Probes {
    pub ebpf: Ebpf,
    /// Libraries with at least one probe attached, and how many entry points each has.
    pub attached: Vec<(Library, usize)>,
    pins: Pins,
}

impl Probes {
    /// Loads the embedded object into the kernel (reusing pinned maps in `pin_dir`) and
    /// attaches the tracepoints ([`TRACEPOINTS`]).
    pub fn load(pin_dir: &Path) -> Result<Self> {
        ensure_tracefs()?;
        let mut pins = Pins::open(pin_dir)?;
        let reused = pins.has_maps();
        // Maps pinned by an agent of another build can fail at load or, when their sizes
        // still fit, only when the programs that use them are verified: either way start over
        // with fresh maps (once), saying so, rather than stopping on a verifier log.
        let mut ebpf = match load_verified(&pins) {
            Ok(ebpf) => ebpf,
            Err(err) if reused => {
                tracing::warn!(
                    "the pinned maps in {} do not fit this build ({err:#}): starting with fresh \
                     ones (usage recorded so far is lost)",
                    pins.dir.display()
                );
                pins.reset_maps();
                load_verified(&pins).with_context(|| {
                    format!(
                        "loading fgpu's eBPF programs with fresh maps in {} (remove that \
                         directory if an older agent left other state there)",
                        pins.dir.display()
                    )
                })?
            }
            Err(err) => return Err(err),
        };
        if reused {
            tracing::info!(dir = %pins.dir.display(), "reusing the kernel state of the previous agent");
        }
        for (name, category, event) in TRACEPOINTS {
            let tp: &mut TracePoint = ebpf
                .program_mut(name)
                .with_context(|| format!("eBPF object lacks program {name}"))?
                .try_into()?;
            let id = tp
                .attach(category, event)
                .with_context(|| format!("attaching to tracepoint {category}/{event}"))?;
            pins.pin(FdLink::try_from(tp.take_link(id)?)?)?;
        }
        Ok(Self {
            ebpf,
            attached: Vec::new(),
            pins,
        })
    }

    /// Detaches the previous agent's probes; call once this agent's are attached.
    pub fn retire_previous(&mut self) {
        let n = self.pins.retire_old();
        if n > 0 {
            tracing::info!(links = n, "took over from the previous agent's probes");
        }
    }

    /// Attaches the entry and return probes to every allocation-class entry point that
    /// `lib` exports. Returns how many entry points were probed; an error if none was.
    ///
    /// Frees first, and of each entry point its return before its entry: while probes are
    /// being attached no allocation is charged whose free would not be credited (a tenant
    /// churning cgroups would otherwise keep every cgroup of that window tracked until its
    /// process exits, and meet its bound on cgroups), and no free's entry takes a record
    /// that no return puts back.
    pub fn attach_library(&mut self, lib: Library) -> Result<usize> {
        let mut probed = 0;
        let mut missing = Vec::new();
        let (frees, allocs): (Vec<ApiId>, Vec<ApiId>) =
            ApiId::of(lib.driver).partition(|&a| releases(a));
        for api in frees.into_iter().chain(allocs) {
            for &symbol in api.symbols() {
                match self.attach_symbol(&lib.path, symbol, api) {
                    Ok(()) => probed += 1,
                    Err(err) => missing.push(format!("{symbol} ({err:#})")),
                }
            }
        }
        if probed == 0 {
            bail!(
                "{}: no allocation entry point could be probed: {}",
                lib.path.display(),
                missing.join("; ")
            );
        }
        if !missing.is_empty() {
            tracing::warn!(
                library = %lib.path.display(),
                "entry points not probed: {}",
                missing.join("; ")
            );
        }
        tracing::info!(library = %lib.path.display(), driver = ?lib.driver, probed, "attached");
        self.attached.push((lib, probed));
        Ok(probed)
    }

    fn attach_symbol(&mut self, path: &Path, symbol: &str, api: ApiId) -> Result<()> {
        for name in [fgpu_ebpf::PROG_LEAVE, fgpu_ebpf::PROG_ENTER] {
            let point = UProbeAttachPoint {
                location: UProbeAttachLocation::Symbol(symbol),
                cookie: Some(api as u64),
            };
            let prog = uprobe(&mut self.ebpf, name)?;
            let id = prog.attach(point, path, UProbeScope::AllProcesses)?;
            let link = FdLink::try_from(prog.take_link(id)?)
                .context("this kernel cannot pin uprobe links (needs Linux 5.15+)")?;
            self.pins.pin(link)?;
        }
        Ok(())
    }
}

/// Whether `api` gives memory back (a free or a VMM release).
fn releases(api: ApiId) -> bool {
    matches!(
        api,
        ApiId::CuMemFree
            | ApiId::CuMemFreeAsync
            | ApiId::CuMemRelease
            | ApiId::HipFree
            | ApiId::HipFreeAsync
            | ApiId::HipMemRelease
    )
}

/// The tracepoint programs and what each is attached to: process exit (releases a dead
/// process's bytes), exec (a process may map a driver library soon), cgroup removal
/// (prunes the removed cgroup's records) and creation (a new shared parent to mark).
const TRACEPOINTS: [(&str, &str, &str); 4] = [
    (fgpu_ebpf::PROG_EXIT, "sched", "sched_process_exit"),
    (fgpu_ebpf::PROG_EXEC, "sched", "sched_process_exec"),
    (fgpu_ebpf::PROG_CGROUP_RMDIR, "cgroup", "cgroup_rmdir"),
    (fgpu_ebpf::PROG_CGROUP_MKDIR, "cgroup", "cgroup_mkdir"),
];

/// Loads the object with `pins`' maps and verifies every program (attached afterwards).
fn load_verified(pins: &Pins) -> Result<Ebpf> {
    let mut ebpf = load_object(pins)?;
    for name in [fgpu_ebpf::PROG_ENTER, fgpu_ebpf::PROG_LEAVE] {
        uprobe(&mut ebpf, name)?
            .load()
            .with_context(|| format!("verifying eBPF program {name}"))?;
    }
    for (name, _, _) in TRACEPOINTS {
        let tp: &mut TracePoint = ebpf
            .program_mut(name)
            .with_context(|| format!("eBPF object lacks program {name}"))?
            .try_into()?;
        tp.load()
            .with_context(|| format!("verifying eBPF program {name}"))?;
    }
    Ok(ebpf)
}

fn load_object(pins: &Pins) -> Result<Ebpf> {
    let mut loader = EbpfLoader::new();
    // `call_args` is task-local storage, which aya loads and pins but cannot read: user
    // space never needs to.
    loader.allow_unsupported_maps();
    pins.configure(&mut loader);
    loader
        .load(fgpu_ebpf::object())
        .context("loading fgpu's eBPF object into the kernel")
}

fn uprobe<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe> {
    let prog = ebpf
        .program_mut(name)
        .with_context(|| format!("eBPF object lacks program {name}"))?;
    Ok(prog.try_into()?)
}

/// Tracepoints are attached through tracefs; mount it where the kernel expects it if no
/// one has (minimal hosts and containers often lack it).
fn ensure_tracefs() -> Result<()> {
    let dir = Path::new("/sys/kernel/tracing");
    let mounted = |d: &Path| d.join("events").exists();
    if mounted(dir) || mounted(Path::new("/sys/kernel/debug/tracing")) {
        return Ok(());
    }
    let src = c"tracefs";
    let target = c"/sys/kernel/tracing";
    // SAFETY: all pointers are valid NUL-terminated strings; data may be NULL.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            src.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        bail!("tracefs is not mounted and mounting it on /sys/kernel/tracing failed: {err}");
    }
    tracing::info!("mounted tracefs on /sys/kernel/tracing");
    Ok(())
}
