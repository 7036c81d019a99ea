//! libfgpu: preloaded into workloads (`LD_PRELOAD=libfgpu.so`) to make a container's GPU
//! memory limit real for unmodified CUDA programs. See docs/shim.md.
//!
//! With the fgpu agent, the limits come from the agent, which hands over the cgroup's ledger
//! (`fgpu_common::ledger`) as two memfds: limits read-only, usage shared by all processes of
//! the cgroup. Without an agent (standalone mode) the limit comes from the environment
//! (`FGPU_MEMORY_LIMIT`, `GPU_MEM_LIMIT_GB`, which under an agent can only lower its limit),
//! and the processes of the container share one ledger file in shared memory. Without either,
//! or without a driver, the shim passes everything through untouched.
//!
//! - [`dlsym`]: `dlsym` interposition; [`real`]: the real driver entry points.
//! - [`cuda`]: CUDA's and NVML's wrappers (allocation and free paths, memory pools, VMM,
//!   arrays, context overhead, memory-info answers, the launch entry points,
//!   `cuGetProcAddress(_v2)` and the table of wrapped entry points); [`account`]: the
//!   accounting they share; [`table`]: per-process pointer/handle tables.
//! - [`ledger`]: where the ledger comes from (the agent, the standalone file), this process's
//!   slot, migration after an agent restart; [`agent_link`]: the agent connection (Hello, the
//!   two memfds, reconnects); [`fork`]; [`config`]; [`log`]; [`sys`]; [`registered`]: what
//!   lower modules call back up into.
//! - [`gate`]: the launch gate that admits GPU work by turns or measured GPU time
//!   (docs/compute.md); [`hook`]: inline hooks on the driver's launch entry points, for
//!   launches that bypass symbol lookup.
//! - [`hip`]: the same limits for AMD's HIP runtime and ROCm SMI (docs/amd.md).

mod account;
mod agent_link;
mod config;
mod cuda;
mod dlsym;
mod fork;
mod gate;
mod hip;
mod hook;
mod ledger;
mod log;
mod park;
mod real;
mod registered;
mod sys;
mod table;

/// Runs when the library is loaded: registers what lower modules call back up (the launch
/// hooks' installation, the fast-path publish, CUDA's and HIP's gate tables, the gate's hooks
/// for the agent link, the accounting's hooks into context and pool: static `fn` pointers and
/// tables, each in a [`registered::Registered`], before anything is resolved), resolves
/// pointers only (the real `dlsym`, and the driver libraries if they are already loaded) and
/// registers the fork handler. Everything else happens lazily at the first call that needs it.
extern "C" fn init() {
    real::dl::ensure_real();
    real::after_cuda_resolved(&INSTALL_LAUNCH_HOOKS);
    gate::on_publish(&PUBLISH_FAST_PATHS);
    gate::register_api(gate::Api::Cuda, &cuda::GATE_API);
    gate::register_api(gate::Api::Hip, &hip::GATE_API);
    park::on_close_fast_paths(&CLOSE_FAST_PATHS);
    agent_link::register_gate(&GATE_HOOKS);
    account::register_hooks(&ACCOUNT_HOOKS);
    real::resolve(real::Lib::Cuda, false);
    real::resolve(real::Lib::Nvml, false);
    fork::register();
}

/// Installs the inline hooks on the driver's launch entry points (crate::hook), after every
/// resolution of CUDA's entry points (they are installed once).
static INSTALL_LAUNCH_HOOKS: fn() = install_launch_hooks;

fn install_launch_hooks() {
    hook::install(&cuda::launch::hook_entries());
}

/// Publishes the launch entry points' fast paths, CUDA's and HIP's, when the gate switches
/// (`open`: no launch is gated).
static PUBLISH_FAST_PATHS: fn(bool) = publish_fast_paths;

fn publish_fast_paths(open: bool) {
    cuda::launch::publish(open);
    hip::launch::publish(open);
}

/// Closes the launch fast paths (a parkable process's launches pass parking's door).
static CLOSE_FAST_PATHS: fn() = close_fast_paths;

fn close_fast_paths() {
    publish_fast_paths(false);
}

/// What the agent link tells the gate.
static GATE_HOOKS: agent_link::GateHooks = agent_link::GateHooks {
    ledger_changed: gate::ledger_changed,
    check_generation: gate::check_generation,
};

/// What the accounting calls back up into.
static ACCOUNT_HOOKS: account::AccountHooks = account::AccountHooks {
    before_reserve: cuda::context::maybe_refresh_overhead,
    pool_returned: cuda::pool::returned,
};

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;
