//! The ledger's memory against a hostile container (issue 11): a process handed its
//! cgroup's ledger cannot resize or reseal the usage memfd (on 872d713 a `ftruncate` killed
//! the agent with SIGBUS) nor map the limits page writable, and a Hello that offers a forged
//! usage memfd is refused; through all of it the agent keeps serving and every other
//! container keeps its limit. Real agent (`fgpu agent --sim`), real cgroups and PID
//! namespaces; `privileged_*` need root.

mod common;

use common::agent::*;
use fgpu_testkit::{Cgroup, privileged, unique};

/// Re-executed as a client by `AgentWorld::client`; does nothing in a normal test run.
#[test]
fn client_entry() {
    if common::client::main() {
        std::process::exit(0);
    }
}

const MIB: u64 = 1 << 20;

/// The victim: 512 MiB held in a 1 GiB cgroup (300 MiB of context overhead on top), then
/// (once released) 768 MiB more, which the limit must refuse.
fn victim(w: &AgentWorld) -> (Cgroup, Proc) {
    let cg = Cgroup::new(&unique("fgpu-trust-victim"));
    w.set_limit(&cg, "1GiB");
    let mut p = w.load(&cg, &[], &["alloc", "512MiB", "hold", "alloc", "768MiB"]);
    p.expect("alloc");
    (cg, p)
}

fn still_serving(w: &AgentWorld, agent: &Agent, what: &str) {
    let (ok, out) = w.fgpu(&["status", "--json"]);
    assert!(
        ok && out.trim_start().starts_with('['),
        "{what}: the agent no longer answers: {out}\nagent log:\n{}",
        agent.log_text()
    );
}

fn victim_holds(p: Proc, agent: &Agent) {
    let f = p.finish();
    assert_eq!(
        f.allocs(),
        vec![Ok(512 * MIB), Err(2)],
        "the victim's 1 GiB limit must still hold: {f}\nagent log:\n{}",
        agent.log_text()
    );
}

#[test]
fn privileged_a_tenant_cannot_resize_or_reseal_its_ledger() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("trustmem");
    let agent = w.agent();
    let (_vcg, vp) = victim(&w);
    let cg = Cgroup::new(&unique("fgpu-trust-attacker"));
    w.set_limit(&cg, "1GiB");
    let f = w.client(&cg, &[], "tamper", &[]).finish();
    assert_eq!(f.code, Some(0), "{f}");
    assert!(f.line("tamper alloc").contains("Ok("), "{f}");
    for (op, errno) in [
        ("shrink", libc::EPERM),
        ("grow", libc::EPERM),
        ("seal-write", libc::EPERM),
        ("seal-future-write", libc::EPERM),
        ("mprotect-limits-writable", libc::EACCES),
    ] {
        let line = f.line(&format!("tamper {op} "));
        assert!(
            line.contains("rc=-1") && line.contains(&format!("errno={errno}")),
            "{op} must be refused (errno {errno}): {line}\n{f}"
        );
    }
    assert!(f.line("tamper done").contains("total=1073741824"), "{f}");
    still_serving(&w, &agent, "after the tampering");
    victim_holds(vp, &agent);
}

#[test]
fn privileged_a_forged_usage_memfd_in_hello_is_refused() {
    if !privileged() {
        return;
    }
    let w = AgentWorld::new("trustforge");
    let agent = w.agent();
    let (_vcg, vp) = victim(&w);
    for (kind, what) in [
        (1, "unsealed"),
        (2, "wrong size"),
        (3, "write-sealed"),
        (4, "not a memfd"),
    ] {
        let cg = Cgroup::new(&unique("fgpu-trust-forger"));
        w.set_limit(&cg, "1GiB");
        let f = w
            .client(&cg, &[], "forged-hello", &[&kind.to_string()])
            .finish();
        let line = f.line("forged reply");
        assert!(
            line.contains("kind=0xffff") && line.contains("refusing the usage memfd"),
            "a {what} usage memfd must be refused: {line}\n{f}\nagent log:\n{}",
            agent.log_text()
        );
        still_serving(&w, &agent, what);
        // The cgroup's next shim gets a ledger of the agent's own, and its limit holds.
        let f = w
            .load(&cg, &[], &["alloc", "512MiB", "alloc", "512MiB"])
            .finish();
        assert_eq!(
            f.allocs(),
            vec![Ok(512 * MIB), Err(2)],
            "after a forged Hello ({what}) the cgroup's limit holds: {f}"
        );
    }
    victim_holds(vp, &agent);
}
