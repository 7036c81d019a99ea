//! Loading fgpu's eBPF object and attaching its programs.

use std::path::Path;

use anyhow::{Context, Result, bail};
use aya::Ebpf;
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};
use aya::programs::{TracePoint, UProbe};
use fgpu_common::event::ApiId;

use super::discovery::Library;

/// The loaded object and what it is attached to. Dropping it detaches everything.
pub struct Probes {
    pub ebpf: Ebpf,
    /// Libraries with at least one probe attached, and how many entry points each has.
    pub attached: Vec<(Library, usize)>,
}

impl Probes {
    /// Loads the embedded object into the kernel and attaches the process-exit tracepoint.
    pub fn load() -> Result<Self> {
        ensure_tracefs()?;
        let mut ebpf = Ebpf::load(fgpu_ebpf::object())
            .context("loading fgpu's eBPF object into the kernel")?;
        for name in [fgpu_ebpf::PROG_ENTER, fgpu_ebpf::PROG_LEAVE] {
            uprobe(&mut ebpf, name)?
                .load()
                .with_context(|| format!("verifying eBPF program {name}"))?;
        }
        let exit: &mut TracePoint = ebpf
            .program_mut(fgpu_ebpf::PROG_EXIT)
            .context("eBPF object lacks the process-exit program")?
            .try_into()?;
        exit.load()
            .with_context(|| format!("verifying eBPF program {}", fgpu_ebpf::PROG_EXIT))?;
        exit.attach("sched", "sched_process_exit")
            .context("attaching to tracepoint sched/sched_process_exit")?;
        let exec: &mut TracePoint = ebpf
            .program_mut(fgpu_ebpf::PROG_EXEC)
            .context("eBPF object lacks the exec program")?
            .try_into()?;
        exec.load()
            .with_context(|| format!("verifying eBPF program {}", fgpu_ebpf::PROG_EXEC))?;
        exec.attach("sched", "sched_process_exec")
            .context("attaching to tracepoint sched/sched_process_exec")?;
        Ok(Self {
            ebpf,
            attached: Vec::new(),
        })
    }

    /// Attaches the entry and return probes to every allocation-class entry point that
    /// `lib` exports. Returns how many entry points were probed; an error if none was.
    pub fn attach_library(&mut self, lib: Library) -> Result<usize> {
        let mut probed = 0;
        let mut missing = Vec::new();
        for api in ApiId::of(lib.driver) {
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
        for name in [fgpu_ebpf::PROG_ENTER, fgpu_ebpf::PROG_LEAVE] {
            let point = UProbeAttachPoint {
                location: UProbeAttachLocation::Symbol(symbol),
                cookie: Some(api as u64),
            };
            uprobe(&mut self.ebpf, name)?.attach(point, path, UProbeScope::AllProcesses)?;
        }
        Ok(())
    }
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
