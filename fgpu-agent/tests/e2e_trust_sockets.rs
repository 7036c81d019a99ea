//! End-to-end: the trust boundary on the containers' socket and what the operator is shown of
//! tenants, each attack as it was observed before its fix:
//! - a connection kept by a child after the process that opened it exited, whose PID then
//!   names a process of another cgroup, must not get that cgroup's ledger;
//! - the agent must not hand out its own descriptors (other tenants' usage pages) as a new
//!   ledger's page, nor adopt for a cgroup a page that was another cgroup's;
//! - one tenant's many sub-cgroups share one connection quota: a shim elsewhere is still
//!   admitted and the host's `status` answers within 100 ms.
//!
//! And what the operator is shown of what tenants chose or wrote:
//! - a cgroup named with terminal sequences reaches `fgpu status` and the text log escaped;
//! - a tenant's look-alike of another pod's cgroups inside its own is reported as the
//!   tenant, in `fgpu status --json` and the metrics, and `container:ID` finds the real one;
//! - the denial count a tenant writes in its usage page is shown as the tenant's report.

mod common;
mod metrics_http;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Agent, Cgroup, Load, SimState, privileged, status_round_trip, unique};
use serde_json::Value;

/// Client side of the shim protocol in Python; every reply is printed as one JSON line:
/// `{"kind", "text" (a LedgerReply's cgroup or an Error's message), "fds", "usage_ino"}`.
const LIB: &str = r#"
import json, os, select, socket, struct, sys, time
path = sys.argv[1]
def hello_frame(flags=0):
    return b"FGPU" + struct.pack("<HHI", 1, 16, 8) + struct.pack("<II", 1, flags)
def answer(s, t=5):
    s.settimeout(t)
    try:
        msg, fds, _, _ = socket.recv_fds(s, 65536, 4)
    except socket.timeout:
        return {"reply": "timeout"}, []
    except OSError as e:
        return {"reply": "oserror %s" % e}, []
    if not msg:
        return {"reply": "closed"}, []
    kind, length = struct.unpack_from("<HI", msg, 6)
    end = 12 + length  # one frame: a second one sent behind it is not this answer's
    text = (msg[20:end] if kind == 0x8010 else msg[12:end]).decode(errors="replace")
    out = {"kind": kind, "text": text, "fds": len(fds)}
    if len(fds) == 2:
        out["usage_ino"] = os.fstat(fds[1]).st_ino
    return out, fds
def hello(attach=None):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    try:
        if attach is None:
            s.sendall(hello_frame())
        else:
            socket.send_fds(s, [hello_frame(1)], [attach])
    except OSError:
        pass  # refused at accept: the refusal is waiting to be read
    out, fds = answer(s)
    return s, out, fds
def say(d):
    print(json.dumps(d), flush=True)
"#;

/// Item 2. A process opens a connection and forks a holder, then exits; the test gives its
/// PID to a process of the victim's cgroup; on "go" the holder says Hello on the kept
/// connection.
const PID_REUSE: &str = r#"
opener = os.fork()
if opener == 0:
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    time.sleep(0.3)  # identified at accept while alive (either way, refused below)
    if os.fork() == 0:
        sys.stdin.readline()
        s.sendall(hello_frame())
        out, fds = answer(s)
        say(out)
        sys.stdin.read()
    os._exit(0)
os.waitpid(opener, 0)
say({"opener": opener})
time.sleep(600)
"#;

/// Item 2. An honest shim: Hello, then its connection held idle past the agent's idle
/// timeout (10 s); then a second Hello on the same connection.
const LONG_LIVED: &str = r#"
s, out, fds = hello()
say(out)
time.sleep(float(sys.argv[2]))
p = select.poll()
p.register(s, select.POLLIN | select.POLLHUP)
say({"still_open": not p.poll(0)})
s.sendall(hello_frame())
out, _ = answer(s)
say(out)
out, _ = answer(s)
say(out)
"#;

/// Item 3. Hello (printing the usage inode); on "offer", a new connection's Hello with the
/// usage memfd of the first attached; on "again", a plain Hello on a new connection.
const HOLDER: &str = r#"
s, out, fds = hello()
say(out)
for line in sys.stdin:
    if line.strip() == "offer":
        _, o, _ = hello(attach=fds[1])
        say(o)
    elif line.strip() == "again":
        _, o, _ = hello()
        say(o)
"#;

/// Item 6. `argv[2]` connections, each saying Hello; prints how many got a ledger and the
/// distinct refusals, then holds them all.
const CONNECTIONS: &str = r#"
import resource
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held, refusals, admitted = [], set(), 0
for i in range(int(sys.argv[2])):
    s, out, fds = hello()
    if out.get("kind") == 0x8010:
        admitted += 1
        held.append((s, fds))
    else:
        refusals.add(out.get("text") or out.get("reply"))
        s.close()
say({"admitted": admitted, "refusals": sorted(refusals)})
sys.stdin.read()
"#;

/// A Python client of [`LIB`] + `script` in `cg`, in the host's PID namespace (the agent
/// sees the PIDs it prints).
struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Client {
    fn spawn(cg: &Cgroup, agent: &Agent, script: &str, args: &[&str]) -> Self {
        let mut cmd = Command::new(common::find_python());
        cmd.arg("-c")
            .arg(format!("{LIB}{script}"))
            .arg(&agent.socket)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        cg.enter_on_exec(&mut cmd);
        let mut child = cmd.spawn().expect("starting python");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
        }
    }

    fn line(&mut self) -> Value {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const LEDGER_REPLY: u64 = 0x8010;
const ERROR: u64 = 0xFFFF;

/// Starts `sleep` in `cg` as host PID `pid` (freed a moment ago): the kernel's next PID is
/// steered with `ns_last_pid`, retried while other processes of the machine take it first.
fn take_pid(pid: u32, cg: &Cgroup) -> Child {
    for _ in 0..500 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
            .expect("writing ns_last_pid");
        let mut cmd = Command::new("sleep");
        cmd.arg("120");
        cg.enter_on_exec(&mut cmd);
        let mut child = cmd.spawn().unwrap();
        if child.id() == pid {
            return child;
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("could not give PID {pid} to a process of {}", cg.path);
}

#[test]
fn privileged_a_kept_connection_never_gets_the_ledger_of_its_pids_next_owner() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let attacker = Cgroup::new(&unique("fgpu-trust-reuser"));
    let victim = Cgroup::new(&unique("fgpu-trust-reused"));
    let honest = Cgroup::new(&unique("fgpu-trust-longlived"));
    for (cg, limit) in [(&attacker, "512MiB"), (&victim, "2GiB"), (&honest, "1GiB")] {
        common::ok(&agent.cli(&["limit", "set", &cg.path, "--memory", limit]));
    }
    // The honest shim holds its connection for 12 s meanwhile.
    let mut long = Client::spawn(&honest, &agent, LONG_LIVED, &["12"]);
    let first = long.line();
    assert_eq!(first["kind"], LEDGER_REPLY, "{first}");
    assert_eq!(first["text"], honest.path.as_str(), "{first}");
    let since = Instant::now();

    let mut reuser = Client::spawn(&attacker, &agent, PID_REUSE, &[]);
    let opener = reuser.line()["opener"].as_u64().unwrap() as u32;
    let mut new_owner = take_pid(opener, &victim);
    let text = std::fs::read_to_string(format!("/proc/{opener}/cgroup")).unwrap();
    assert!(text.trim_end().ends_with(&victim.path), "{text}");
    reuser.send("go");
    let got = reuser.line();
    eprintln!(
        "the kept connection's Hello after its PID went to {}: {got}",
        victim.path
    );
    assert_ne!(
        got["text"],
        victim.path.as_str(),
        "the victim's ledger was handed to a connection of {}: {got}",
        attacker.path
    );
    assert_eq!(got["kind"], ERROR, "{got}");
    assert_eq!(
        got["text"],
        "the process that opened this connection has exited: connect again for a ledger",
        "{got}"
    );
    let _ = new_owner.kill();
    let _ = new_owner.wait();

    // The honest shim: still connected past the idle timeout; a second Hello is refused
    // and its connection closed.
    let open = long.line();
    assert!(since.elapsed() >= Duration::from_secs(10));
    assert_eq!(open["still_open"], true, "{open}");
    let second = long.line();
    assert_eq!(
        second,
        serde_json::json!({"kind": ERROR, "fds": 0,
            "text": "this connection has already said Hello: connect again for another ledger"}),
    );
    let then = long.line();
    assert_eq!(then["reply"], "closed", "{then}");
}

#[test]
fn privileged_the_agent_never_adopts_its_own_or_another_cgroups_usage_page() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let tenant = Cgroup::new(&unique("fgpu-trust-pageowner"));
    let home = Cgroup::new(&unique("fgpu-trust-agenthome"));
    let elsewhere = Cgroup::new(&unique("fgpu-trust-pagecarrier"));
    let third = Cgroup::new(&unique("fgpu-trust-pageoffer"));
    // A tenant's ledger: the agent holds its usage page from now on.
    let mut owner = Client::spawn(&tenant, &agent, HOLDER, &[]);
    let theirs = owner.line();
    assert_eq!(theirs["text"], tenant.path.as_str(), "{theirs}");
    let page = theirs["usage_ino"].as_u64().unwrap();

    // The agent moves into a cgroup of its own; a shim there makes that cgroup's ledger.
    let agent_procs = |cg: &str| {
        format!(
            "{}/cgroup.procs",
            common::cgroup2_mount()
                .join(cg.trim_start_matches('/'))
                .display()
        )
    };
    let text = std::fs::read_to_string(format!("/proc/{}/cgroup", agent.pid())).unwrap();
    let agent_was = fgpu_common::cgroup::unified_path(&text)
        .unwrap()
        .to_string();
    std::fs::write(agent_procs(&home.path), agent.pid().to_string()).unwrap();
    let mut neighbour = Client::spawn(&home, &agent, HOLDER, &[]);
    let in_home = neighbour.line();
    std::fs::write(agent_procs(&agent_was), agent.pid().to_string()).unwrap();

    // The tenant's process moves to another cgroup holding its page; that cgroup's first
    // shim, and then its Hello offering the page from a third cgroup.
    std::fs::write(agent_procs(&elsewhere.path), owner.pid().to_string()).unwrap();
    let mut carried = Client::spawn(&elsewhere, &agent, HOLDER, &[]);
    let in_elsewhere = carried.line();
    std::fs::write(agent_procs(&third.path), owner.pid().to_string()).unwrap();
    owner.send("offer");
    let offered = owner.line();
    eprintln!(
        "the tenant's page is inode {page}; the agent's own cgroup got {in_home}; a cgroup \
         where a process held the page got {in_elsewhere}; one offered it in a Hello got \
         {offered}"
    );
    for (what, got, cg) in [
        ("the agent's own cgroup", &in_home, &home),
        (
            "a cgroup whose process held the page",
            &in_elsewhere,
            &elsewhere,
        ),
        ("a cgroup whose shim offered it", &offered, &third),
    ] {
        assert_eq!(got["kind"], LEDGER_REPLY, "{what}: {got}");
        assert_eq!(got["text"], cg.path.as_str(), "{what}: {got}");
        assert_ne!(
            got["usage_ino"].as_u64(),
            Some(page),
            "{what} was given {}'s usage page: {got}\n{}",
            tenant.path,
            agent.log_text()
        );
    }
    let log = agent.log_text();
    assert!(
        log.contains("not adopting the usage memfd a shim offered"),
        "no warning for the offered page:\n{log}"
    );
    assert!(
        log.contains("not adopting usage memfds held by processes of the cgroup"),
        "no warning for the held page:\n{log}"
    );
    // The tenant itself still gets its own page back.
    std::fs::write(agent_procs(&tenant.path), owner.pid().to_string()).unwrap();
    owner.send("again");
    let back = owner.line();
    assert_eq!(back["usage_ino"].as_u64(), Some(page), "{back}");
}

#[test]
fn privileged_a_tenants_sub_cgroups_share_one_connection_quota() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let tenant = Cgroup::new(&unique("fgpu-trust-manycg"));
    let subs: Vec<Cgroup> = (0..17)
        .map(|i| Cgroup::new(&format!("{}/s{i}", tenant.path.trim_start_matches('/'))))
        .collect();
    let mut rtt = Vec::new();
    let mut flood: Vec<Client> = subs
        .iter()
        .map(|cg| Client::spawn(cg, &agent, CONNECTIONS, &["256"]))
        .collect();
    let results: Vec<Value> = flood
        .iter_mut()
        .map(|c| {
            rtt.push(status_round_trip(&agent.admin).0);
            c.line()
        })
        .collect();
    for _ in 0..10 {
        rtt.push(status_round_trip(&agent.admin).0);
        std::thread::sleep(Duration::from_millis(50));
    }
    let newcomer = Cgroup::new(&unique("fgpu-trust-afterflood"));
    let mut shim = Client::spawn(&newcomer, &agent, HOLDER, &[]);
    let hello = shim.line();
    let admitted: u64 = results
        .iter()
        .map(|r| r["admitted"].as_u64().unwrap())
        .sum();
    let max = rtt.iter().copied().fold(0.0, f64::max);
    eprintln!(
        "17 sub-cgroups of {} asking 256 connections each: {admitted} admitted, refusals \
         {:?}; host status round trip at most {max:.2} ms ({} requests); a shim elsewhere got \
         {hello}",
        tenant.path,
        results
            .iter()
            .flat_map(|r| r["refusals"].as_array().cloned().unwrap_or_default())
            .map(|t| t.to_string())
            .collect::<std::collections::BTreeSet<_>>(),
        rtt.len()
    );
    assert_eq!(
        hello["kind"], LEDGER_REPLY,
        "the shim elsewhere was refused: {hello}"
    );
    assert_eq!(hello["text"], newcomer.path.as_str(), "{hello}");
    assert_eq!(hello["fds"], 2, "{hello}");
    assert_eq!(admitted, 256, "{results:?}");
    let refusal = format!(
        "too many connections from {}: at most 256 at once per tenant",
        tenant.path
    );
    for r in &results {
        let texts = r["refusals"].as_array().unwrap();
        assert!(texts.iter().all(|t| t == refusal.as_str()), "{r}");
    }
    assert!(max < 100.0, "a status round trip took {max:.1} ms");
    drop(flood);
}

/// Whether `text` has a character a terminal could act on or hide (a C0 control other than
/// the line ends, DEL, a C1 control, a bidi or other invisible format character).
fn raw_controls(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| c != '\n' && fgpu_common::inert::is_unsafe(c))
        .collect()
}

/// A sim load (no shim) in `cg` holding `size` of GPU memory until dropped.
fn holder(cg: &Cgroup, state: &SimState, size: &str) -> Load {
    let mut load = Load::spawn(cg, &state.0, &["alloc", size, "hold"]);
    load.expect_line("ready");
    load
}

#[test]
fn privileged_a_cgroup_named_with_terminal_sequences_reaches_the_admin_escaped() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let state = SimState::new();
    let tenant = Cgroup::new(&unique("fgpu-trust-esc"));
    // Clear the screen, put `rm -rf ~` in the admin's clipboard (OSC 52), go back to the
    // start of the line and write a fake row over it, turn what follows around.
    let evil = "x\x1b[2J\x1b]52;c;cm0gLXJmIH4K\x07\r/fgpu-ok 0 - \u{202e}gnp.exe";
    let cg = Cgroup::new(&format!("{}/{evil}", &tenant.path[1..]));
    common::ok(&agent.cli(&["limit", "set", &cg.path, "--memory", "1GiB"]));
    // 300 MiB of context, 2 x 256 MiB, then one more 256 MiB refused: an alloc_denied line
    // naming the cgroup.
    let mut load = Load::spawn_with_shim(
        &cg,
        &state.0,
        &agent,
        &[
            "alloc", "256MiB", "alloc", "256MiB", "alloc", "256MiB", "hold",
        ],
    );
    load.expect_line("ready");
    agent.wait_for(&cg, "a denial", Duration::from_secs(5), |s| {
        s.is_some_and(|s| s["alloc_denied"] == 1)
    });

    let out = agent.cli(&["status"]);
    let table = common::ok(&out);
    eprintln!("{table}");
    assert_eq!(
        raw_controls(&table),
        Vec::<char>::new(),
        "`fgpu status` printed raw control characters: {table:?}"
    );
    let shown = format!(
        "{}/x\\x1b[2J\\x1b]52;c;cm0gLXJmIH4K\\x07\\x0d/fgpu-ok 0 - \\u{{202e}}gnp.exe",
        tenant.path
    );
    assert!(table.contains(&shown), "the row names {shown}: {table}");

    let deadline = Instant::now() + Duration::from_secs(5);
    let lines = loop {
        let log = agent.log_text();
        let lines: Vec<String> = log
            .lines()
            .filter(|l| l.contains("alloc_denied") && l.contains(&tenant.path))
            .map(str::to_string)
            .collect();
        if !lines.is_empty() || Instant::now() > deadline {
            break lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        !lines.is_empty(),
        "no alloc_denied line:\n{}",
        agent.log_text()
    );
    let log = agent.log_text();
    assert_eq!(
        raw_controls(&log),
        Vec::<char>::new(),
        "the text log has raw control characters: {lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.contains(&format!("cgroup={shown}"))),
        "{lines:?}"
    );
    drop(load);
}

#[test]
fn privileged_a_tenants_look_alike_of_another_pod_is_reported_as_the_tenant() {
    if !privileged() {
        return;
    }
    let agent = Agent::start_with(&["--metrics", "127.0.0.1:0"]);
    let addr = metrics_http::address_in_log(|| agent.log_text());
    let state = SimState::new();
    let base = unique("fgpu-trust-pods");
    let victim_uid = "0c3d6f1e-2b4a-4c8e-9f00-123456789abc";
    let victim_id = "d1".repeat(32);
    let (a_uid, a_id) = ("1a1a1a1a-2b4a-4c8e-9f00-123456789abc", "a7".repeat(32));
    let b_uid = "2b2b2b2b-2b4a-4c8e-9f00-123456789abc";
    let victim = Cgroup::new(&format!("{base}/kubepods/pod{victim_uid}/{victim_id}"));
    // Tenant a: a containerd container of a pod, with the victim's whole path inside.
    let a = format!("{base}/kubepods/besteffort/pod{a_uid}/{a_id}");
    let a_fake = Cgroup::new(&format!("{a}/kubepods/pod{victim_uid}/{victim_id}"));
    // Tenant b: a container the runtime named `ctr`, with the same look-alike.
    let b = format!("{base}/kubepods/besteffort/pod{b_uid}/ctr");
    let b_fake = Cgroup::new(&format!("{b}/kubepods/pod{victim_uid}/{victim_id}"));
    let _held = [
        holder(&victim, &state, "256MiB"),
        holder(&a_fake, &state, "512MiB"),
        holder(&b_fake, &state, "768MiB"),
    ];
    for cg in [&victim, &a_fake, &b_fake] {
        agent.wait_for(cg, "its memory", Duration::from_secs(5), |s| {
            s.is_some_and(|s| s["memory_used_bytes"].as_u64() > Some(0))
        });
    }

    // `container:ID` resolves to the victim's container, whatever its look-alikes.
    let out = agent.cli(&[
        "limit",
        "set",
        &format!("container:{victim_id}"),
        "--memory",
        "2GiB",
    ]);
    common::ok(&out);
    let limited: Vec<String> = agent
        .status()
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["memory_limit_bytes"] == 2u64 << 30)
        .map(|r| r["cgroup"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(limited, std::slice::from_ref(&victim.path));

    // `fgpu status --json`: each row names its own pod and container.
    let rows = agent.status();
    let row = |cg: &Cgroup| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["cgroup"] == cg.path.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("no row for {}: {rows:#}", cg.path))
    };
    let who = |r: &Value| (r["pod_uid"].clone(), r["container_id"].clone());
    assert_eq!(
        who(&row(&victim)),
        (victim_uid.into(), victim_id.clone().into())
    );
    assert_eq!(
        who(&row(&a_fake)),
        (a_uid.into(), a_id.clone().into()),
        "{}",
        row(&a_fake)
    );
    assert_eq!(
        who(&row(&b_fake)),
        (b_uid.into(), Value::Null),
        "{}",
        row(&b_fake)
    );

    // The metrics: only the victim's own memory is summed into its pod and container.
    let deadline = Instant::now() + Duration::from_secs(5);
    let series = loop {
        let (_, series) = metrics_http::scrape(&addr);
        let have = |cg: &Cgroup| {
            series
                .iter()
                .any(|s| s.name == "fgpu_cgroup_memory_used_bytes" && s.labels["cgroup"] == cg.path)
        };
        if [&victim, &a_fake, &b_fake].into_iter().all(have) || Instant::now() > deadline {
            break series;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let sum_by = |label: &str, value: &str| -> f64 {
        series
            .iter()
            .filter(|s| s.name == "fgpu_cgroup_memory_used_bytes")
            .filter(|s| s.labels.get(label).is_some_and(|v| v == value))
            .map(|s| s.value)
            .sum()
    };
    assert_eq!(sum_by("pod_uid", victim_uid), (256u64 << 20) as f64);
    assert_eq!(sum_by("container_id", &victim_id), (256u64 << 20) as f64);
    assert_eq!(sum_by("pod_uid", a_uid), (512u64 << 20) as f64);
    assert_eq!(sum_by("pod_uid", b_uid), (768u64 << 20) as f64);

    drop(_held);
    drop((a_fake, b_fake, victim));
    for dir in [
        format!("{a}/kubepods/pod{victim_uid}"),
        format!("{a}/kubepods"),
        a.clone(),
        format!("{b}/kubepods/pod{victim_uid}"),
        format!("{b}/kubepods"),
        b.clone(),
        format!("{base}/kubepods/besteffort/pod{a_uid}"),
        format!("{base}/kubepods/besteffort/pod{b_uid}"),
        format!("{base}/kubepods/besteffort"),
        format!("{base}/kubepods/pod{victim_uid}"),
        format!("{base}/kubepods"),
        base.clone(),
    ] {
        let _ = std::fs::remove_dir(common::cgroup2_mount().join(dir));
    }
}

/// Hello, then the count of denials written straight into the usage page (device 0's
/// `alloc_denied`, at byte 40 of the usage memfd), then held.
const WRITES_DENIED: &str = r#"
import mmap
s, out, fds = hello()
m = mmap.mmap(fds[1], 4096)
struct.pack_into("<Q", m, 40, int(sys.argv[2]))
say(out)
sys.stdin.read()
"#;

#[test]
fn privileged_a_denial_count_a_tenant_writes_is_shown_as_its_report() {
    if !privileged() {
        return;
    }
    let agent = Agent::start_with(&["--metrics", "127.0.0.1:0"]);
    let addr = metrics_http::address_in_log(|| agent.log_text());
    let state = SimState::new();
    let tenant = Cgroup::new(&unique("fgpu-trust-denied"));
    common::ok(&agent.cli(&["limit", "set", &tenant.path, "--memory", "4GiB"]));
    let _held = holder(&tenant, &state, "256MiB");
    let mut writer = Client::spawn(&tenant, &agent, WRITES_DENIED, &["424242"]);
    let hello = writer.line();
    assert_eq!(hello["kind"], LEDGER_REPLY, "{hello}");
    agent.wait_for(&tenant, "the written count", Duration::from_secs(5), |s| {
        s.is_some_and(|s| s["alloc_denied"] == 424_242)
    });

    // The table: the column and a legend say whose count it is.
    let table = common::ok(&agent.cli(&["status"]));
    let header = table.lines().next().unwrap();
    assert!(header.contains(" DENIED* "), "{table}");
    assert!(
        table.contains("DENIED*: allocations refused at the limit, as reported by the tenant"),
        "{table}"
    );

    // The metrics: a counter named as the tenant's report, and none that is not.
    let deadline = Instant::now() + Duration::from_secs(5);
    let (text, series) = loop {
        let (text, series) = metrics_http::scrape(&addr);
        if text.contains(&tenant.path) || Instant::now() > deadline {
            break (text, series);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let reported: Vec<f64> = series
        .iter()
        .filter(|s| {
            s.name == "fgpu_cgroup_alloc_denied_reported_total" && s.labels["cgroup"] == tenant.path
        })
        .map(|s| s.value)
        .collect();
    assert_eq!(reported, [424_242.0], "{text}");
    assert!(
        !text.contains("fgpu_cgroup_alloc_denied_total"),
        "a denial counter not named as the tenant's report: {text}"
    );
    assert!(
        text.contains(
            "# HELP fgpu_cgroup_alloc_denied_reported_total Allocations the cgroup's shims report"
        ),
        "{text}"
    );

    // The log: the line says it is the tenant's word.
    let deadline = Instant::now() + Duration::from_secs(5);
    let line = loop {
        let found = agent
            .log_text()
            .lines()
            .find(|l| l.contains("event=\"alloc_denied\"") && l.contains(&tenant.path))
            .map(str::to_string);
        if found.is_some() || Instant::now() > deadline {
            break found;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let line = line.unwrap_or_else(|| panic!("no alloc_denied line:\n{}", agent.log_text()));
    assert!(
        line.contains("as reported by the tenant") && line.contains("reported_by=\"tenant\""),
        "{line}"
    );
    drop(writer);
}
