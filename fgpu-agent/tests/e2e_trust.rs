//! End-to-end: the trust boundary. Root in a "container" (its own cgroup, PID and mount
//! namespace, with its own /proc) cannot change, remove or read limits through any socket it
//! can reach, while the host admin can, and is named in the agent's log; floods of
//! connections, oversized frames, descriptors and slow peers leave the agent answering the
//! host's `fgpu status` within 100 ms and admitting new shims; a tenant making a ledger per
//! cgroup gets at most its bound of them, and neither a thousand ledgers with every slot
//! locked nor a chain of nested cgroups left behind slows the host's status or the CDI hook.

mod common;

use std::os::unix::net::UnixStream;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{
    Agent, Cgroup, Load, SimState, fgpu, lines_now, ok, privileged, status_round_trip, unique,
};

/// What the containers' socket says to anything but Hello and the caller's own status.
const CONTAINERS_REFUSAL: &str = "permission denied: the containers' socket answers Hello and \
     the caller's own status only; limits and other cgroups' status are served only on the \
     host, through the agent's admin socket";

/// Runs `fgpu ARGS` as root in a container: in `cg`, its own PID and mount namespace (own
/// /proc). Unless `admin_visible`, the agent's admin socket directory is hidden under an
/// empty tmpfs, as in a container that has only the containers' socket mounted.
fn in_container(cg: &Cgroup, agent: &Agent, admin_visible: bool, args: &[&str]) -> Output {
    let admin_dir = agent.admin.parent().unwrap();
    let mut script = String::new();
    if !admin_visible {
        script.push_str(&format!(
            "mount -t tmpfs fgpu-hidden '{}' || exit 99; ",
            admin_dir.display()
        ));
    }
    script.push_str("exec \"$@\"");
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--pid",
        "--fork",
        "--mount-proc",
        "--kill-child",
        "sh",
        "-c",
    ])
    .arg(&script)
    .arg("sh")
    .arg(env!("CARGO_BIN_EXE_fgpu"))
    .args(args)
    .env("FGPU_SOCKET", &agent.socket)
    .env_remove("FGPU_ADMIN_SOCKET");
    cg.enter_on_exec(&mut cmd);
    let out = cmd.output().expect("running unshare");
    assert_ne!(
        out.status.code(),
        Some(99),
        "could not hide the admin socket"
    );
    out
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The memory limit `fgpu limit get TARGET --json` reports from the host.
fn memory_limit(agent: &Agent, cg: &Cgroup) -> Option<u64> {
    let entry: serde_json::Value =
        serde_json::from_str(&ok(&agent.cli(&["limit", "get", &cg.path, "--json"]))).unwrap();
    entry["effective"]["memory_bytes"].as_u64()
}

/// The cgroup v2 path of this test process (the host admin's cgroup).
fn own_cgroup() -> String {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    fgpu_common::cgroup::unified_path(&text)
        .expect("in a cgroup v2")
        .to_string()
}

#[test]
fn privileged_root_in_a_container_cannot_set_remove_or_read_limits_through_any_socket() {
    if !privileged() {
        return;
    }
    let agent = Agent::start();
    let victim = Cgroup::new(&unique("fgpu-trust-victim"));
    let me = Cgroup::new(&unique("fgpu-trust-me"));
    ok(&agent.cli(&["limit", "set", &victim.path, "--memory", "1GiB"]));
    ok(&agent.cli(&["limit", "set", &me.path, "--memory", "512MiB"]));
    let before = ok(&agent.cli(&["limit", "ls", "--json"]));

    let containers = agent.socket.to_str().unwrap();
    let admin = agent.admin.to_str().unwrap();
    let attempts: [&[&str]; 5] = [
        &["limit", "rm", &victim.path],
        &["limit", "set", &victim.path, "--memory", "16GiB"],
        &["limit", "set", &me.path, "--memory", "2GiB"],
        &["limit", "get", &victim.path],
        &["limit", "ls"],
    ];
    for attempt in attempts {
        // The socket a container has: refused outright, whatever the request.
        let mut args = attempt.to_vec();
        args.extend(["--socket", containers]);
        let out = in_container(&me, &agent, false, &args);
        assert!(!out.status.success(), "{attempt:?} was accepted");
        assert!(
            stderr(&out).contains(CONTAINERS_REFUSAL),
            "{attempt:?}: {}",
            stderr(&out)
        );
        // With the CLI's defaults (FGPU_SOCKET set, as the shim's environment is): the same.
        let out = in_container(&me, &agent, false, attempt);
        assert!(
            stderr(&out).contains(CONTAINERS_REFUSAL),
            "{attempt:?} with the defaults: {}",
            stderr(&out)
        );
        // The admin socket's path: not there in the container.
        let mut args = attempt.to_vec();
        args.extend(["--socket", admin]);
        let out = in_container(&me, &agent, false, &args);
        assert!(
            stderr(&out).contains("agent is not running (no socket at"),
            "{attempt:?} on the hidden admin socket: {}",
            stderr(&out)
        );
        // An operator who mounted the admin socket into the container by mistake: the peer
        // check (the caller's PID namespace, through its pidfd) still refuses.
        let out = in_container(&me, &agent, true, &args);
        assert!(
            !out.status.success(),
            "{attempt:?} was accepted on the admin socket"
        );
        assert!(
            stderr(&out).contains(
                "permission denied: the caller is not in the agent's PID namespace; the admin \
                 socket serves only callers on the host"
            ),
            "{attempt:?} on a visible admin socket: {}",
            stderr(&out)
        );
    }

    // `fgpu status` in the container: its own row only, with its limit.
    let out = in_container(&me, &agent, false, &["status", "--json"]);
    let rows: serde_json::Value = serde_json::from_str(&ok(&out)).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["cgroup"], me.path.as_str(), "{rows:?}");
    assert_eq!(rows[0]["memory_limit_bytes"], 512u64 << 20, "{rows:?}");
    let table = ok(&in_container(&me, &agent, false, &["status"]));
    assert!(table.contains(&me.path), "{table}");
    assert!(!table.contains(&victim.path), "{table}");
    assert!(table.contains("this cgroup's row only"), "{table}");

    // Nothing changed.
    assert_eq!(memory_limit(&agent, &victim), Some(1 << 30));
    assert_eq!(memory_limit(&agent, &me), Some(512 << 20));
    assert_eq!(ok(&agent.cli(&["limit", "ls", "--json"])), before);
    let refusals = lines_now(&agent, &["refused a limit change", &me.path]);
    assert!(
        refusals.len() >= 3,
        "the refused attempts are not in the log:\n{}",
        agent.log_text()
    );

    // The host admin still can, and the log names who did it.
    let child = Command::new(env!("CARGO_BIN_EXE_fgpu"))
        .args(["limit", "rm", &victim.path, "--socket", admin])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    ok(&child.wait_with_output().unwrap());
    assert_eq!(memory_limit(&agent, &victim), None);
    let host = own_cgroup();
    let audit = lines_now(
        &agent,
        &[
            "limit removed",
            &format!("cgroup=\"{}\"", victim.path),
            "door=\"admin\"",
            "uid=0",
            &format!("pid={pid}"),
            &format!("caller_cgroup=\"{host}\""),
        ],
    );
    assert_eq!(audit.len(), 1, "no audit line:\n{}", agent.log_text());

    // `fgpu run`'s limit changes are audited the same way.
    let name = unique("trust-run");
    ok(&fgpu(&[
        "run",
        "--socket",
        admin,
        "--shim-socket",
        containers,
        "--name",
        &name,
        "--memory",
        "1GiB",
        "--",
        "true",
    ]));
    let run_cgroup = format!("cgroup=\"/fgpu/{name}\"");
    for what in ["limit set", "limit removed"] {
        let lines = lines_now(&agent, &[what, &run_cgroup, "door=\"admin\"", "uid=0"]);
        assert_eq!(
            lines.len(),
            1,
            "`fgpu run`'s {what} is not audited:\n{}",
            agent.log_text()
        );
    }
}

/// Attacks on the containers' socket; each mode prints one JSON line of what it saw.
const ATTACK: &str = r#"
import json, os, select, socket, struct, sys, time
path, mode = sys.argv[1], sys.argv[2]
def conn():
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    return s
def answer(s, t):
    s.settimeout(t)
    try:
        d = s.recv(65536)
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return "oserror"
    if not d:
        return "closed"
    kind = struct.unpack_from("<H", d, 6)[0] if len(d) >= 8 else -1
    return ("error: " if kind == 0xFFFF else "kind %#x: " % kind) + d[12:].decode(errors="replace")
out = {"mode": mode}
if mode == "connections":
    held, errors = [], 0
    for i in range(1000):
        try:
            held.append(conn())
        except OSError:
            errors += 1
    time.sleep(1.5)
    p = select.poll()
    for s in held:
        p.register(s, select.POLLIN)
    ready = {fd for fd, _ in p.poll(0)}
    texts = sorted({answer(s, 0.5) for s in held if s.fileno() in ready})
    out.update(held=len(held), connect_errors=errors, refused=len(ready), refusals=texts)
elif mode == "header":
    s = conn()
    s.sendall(b"FGPU" + struct.pack("<HHI", 1, 16, 64 << 20))
    out["reply"] = answer(s, 5)
    out["then"] = answer(s, 5)
elif mode == "fds":
    null = os.open("/dev/null", os.O_RDONLY)
    s = conn()
    socket.send_fds(s, [b"FG"], [null] * 200)
    out["many_in_one"] = answer(s, 5)
    # Many messages, each one byte of a frame that never completes and three descriptors.
    frame = b"FGPU" + struct.pack("<HHI", 1, 16, 1000) + bytes(1000)
    replies, sent = set(), 0
    for c in range(8):
        s = conn()
        for i in range(1000):
            try:
                socket.send_fds(s, [frame[i:i + 1]], [null] * 3)
                sent += 1
            except OSError:
                break
        replies.add(answer(s, 5))
    out.update(many_messages=sorted(replies), messages_sent=sent)
elif mode == "slow":
    hello = b"FGPU" + struct.pack("<HHI", 1, 16, 8) + struct.pack("<II", 1, 0)
    idle = conn()
    # A Hello the agent refuses does not earn a shim's right to stay idle.
    bad = conn()
    bad.sendall(b"FGPU" + struct.pack("<HHI", 1, 16, 8) + struct.pack("<II", 99, 0))
    out["bad_hello"] = answer(bad, 5)
    slow = [conn() for _ in range(20)]
    start = time.monotonic()
    closed = {}
    p = select.poll()
    for s in slow + [idle, bad]:
        p.register(s, select.POLLIN)
    byte = 0
    while len(closed) < len(slow) + 2 and time.monotonic() - start < 20:
        for s in slow:
            if s.fileno() not in closed and byte < len(hello):
                try:
                    s.send(hello[byte:byte + 1])
                except OSError:
                    closed[s.fileno()] = time.monotonic() - start
        byte += 1
        tick = time.monotonic()
        while time.monotonic() - tick < 1.0:
            for fd, _ in p.poll(100):
                if fd not in closed:
                    closed[fd] = time.monotonic() - start
                    p.unregister(fd)
    out["slow_closed_after_s"] = [closed.get(s.fileno()) for s in slow]
    out["idle_closed_after_s"] = closed.get(idle.fileno())
    out["bad_hello_closed_after_s"] = closed.get(bad.fileno())
elif mode == "status":
    # Its own status, as fast as 32 connections can ask, for 5 s.
    req = b"FGPU" + struct.pack("<HHI", 1, 1, 0)
    conns = [conn() for _ in range(32)]
    answered, other, end = 0, set(), time.monotonic() + 5
    while time.monotonic() < end:
        for s in conns:
            s.sendall(req)
        for s in conns:
            r = answer(s, 5)
            if r.startswith("kind 0x8001: "):
                answered += 1
            else:
                other.add(r[:100])
    out.update(answered=answered, other=sorted(other))
print(json.dumps(out), flush=True)
sys.stdin.read()
"#;

/// Held by the tests that measure the host's status round trip under an attack of many
/// processes, so that two such attacks (each with an agent of its own) do not run at once on
/// a small machine and time each other.
static TIMED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn timed() -> std::sync::MutexGuard<'static, ()> {
    TIMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A shim's Hello, as a new process in its own PID namespace says it; prints the reply.
const HELLO: &str = r#"
import json, socket, struct, sys, time
start = time.monotonic()
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b"FGPU" + struct.pack("<HHI", 1, 16, 8) + struct.pack("<II", 1, 0))
msg, fds, _, _ = socket.recv_fds(s, 65536, 4)
kind = struct.unpack_from("<H", msg, 6)[0]
print(json.dumps({"kind": kind, "fds": len(fds), "cgroup": msg[20:].decode(errors="replace"),
                  "ms": (time.monotonic() - start) * 1000}), flush=True)
sys.stdin.read()
"#;

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

#[test]
fn privileged_floods_leave_the_agent_answering_the_host_within_100ms_and_admitting_shims() {
    if !privileged() {
        return;
    }
    let _timed = timed();
    let agent = Agent::start();
    let state = SimState::new();
    let python = common::find_python();
    let sock = agent.socket.to_str().unwrap().to_string();
    let modes = ["connections", "header", "fds", "slow", "status"];
    let cgroups: Vec<Cgroup> = modes
        .iter()
        .map(|m| Cgroup::new(&unique(&format!("fgpu-trust-{m}"))))
        .collect();
    let mut attackers: Vec<Load> = modes
        .iter()
        .zip(&cgroups)
        .map(|(mode, cg)| Load::spawn_program(cg, &state.0, &python, &["-c", ATTACK, &sock, mode]))
        .collect();
    std::thread::sleep(Duration::from_millis(500));

    // While they run: the host's status, in-process and through the CLI, and the agent's
    // descriptor count.
    let mut rtt = Vec::new();
    let mut cli = Vec::new();
    let mut fds = Vec::new();
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        rtt.push(status_round_trip(&agent.admin).0);
        let start = Instant::now();
        let out = fgpu(&[
            "status",
            "--json",
            "--socket",
            agent.admin.to_str().unwrap(),
        ]);
        cli.push(start.elapsed().as_secs_f64() * 1e3);
        ok(&out);
        fds.push(open_fds(agent.pid()));
        std::thread::sleep(Duration::from_millis(100));
    }
    // A new shim in another container gets its ledger.
    let newcomer = Cgroup::new(&unique("fgpu-trust-newcomer"));
    let mut shim = Load::spawn_program(&newcomer, &state.0, &python, &["-c", HELLO, &sock]);
    let hello: serde_json::Value = serde_json::from_str(&shim.expect_line("{")).unwrap();

    let results: Vec<serde_json::Value> = attackers
        .iter_mut()
        .map(|a| serde_json::from_str(&a.expect_line("{")).unwrap())
        .collect();
    // And once more after every attack has run its course.
    rtt.push(status_round_trip(&agent.admin).0);
    fds.push(open_fds(agent.pid()));

    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    eprintln!(
        "under attack: host status round trip median {:.2} ms, max {:.2} ms ({} requests); \
         `fgpu status` median {:.1} ms, max {:.1} ms ({} runs); agent descriptors at most {}; \
         a new shim's Hello took {:.1} ms; attackers saw {results:?}",
        median(&rtt),
        max(&rtt),
        rtt.len(),
        median(&cli),
        max(&cli),
        cli.len(),
        fds.iter().max().unwrap(),
        hello["ms"].as_f64().unwrap_or(-1.0),
    );

    assert!(
        max(&rtt) < 100.0,
        "a status round trip took {:.1} ms",
        max(&rtt)
    );
    assert!(max(&cli) < 100.0, "`fgpu status` took {:.1} ms", max(&cli));
    assert_eq!(hello["kind"], 0x8010, "the new shim was refused: {hello}");
    assert_eq!(hello["fds"], 2, "{hello}");
    assert_eq!(hello["cgroup"], newcomer.path.as_str(), "{hello}");
    let most_fds = *fds.iter().max().unwrap();
    assert!(most_fds < 1000, "the agent held {most_fds} descriptors");

    let by_mode = |m: &str| results.iter().find(|r| r["mode"] == m).unwrap().clone();
    let conns = by_mode("connections");
    assert_eq!(conns["held"], 1000, "{conns}");
    assert_eq!(conns["refused"], 1000 - 256, "{conns}");
    assert_eq!(
        conns["refusals"],
        serde_json::json!([format!(
            "error: too many connections from {}: at most 256 at once per tenant",
            cgroups[0].path
        )]),
        "{conns}"
    );
    let header = by_mode("header");
    assert_eq!(
        header["reply"],
        "error: frame of 67108864 bytes exceeds the 1024-byte limit of this socket",
        "{header}"
    );
    assert_eq!(header["then"], "closed", "{header}");
    let fd = by_mode("fds");
    assert_eq!(
        fd["many_in_one"], "error: too many file descriptors in one message (at most 4)",
        "{fd}"
    );
    assert_eq!(
        fd["many_messages"],
        serde_json::json!(["error: too many file descriptors: at most 2 per request"]),
        "{fd}"
    );
    let slow = by_mode("slow");
    for after in slow["slow_closed_after_s"].as_array().unwrap() {
        let s = after.as_f64().unwrap_or(f64::INFINITY);
        assert!(
            (1.5..5.0).contains(&s),
            "a slow peer was closed after {s} s: {slow}"
        );
    }
    let spam = by_mode("status");
    assert!(spam["answered"].as_u64().unwrap() > 32, "{spam}");
    assert_eq!(spam["other"], serde_json::json!([]), "{spam}");
    let idle = slow["idle_closed_after_s"]
        .as_f64()
        .unwrap_or(f64::INFINITY);
    assert!(
        (9.0..13.0).contains(&idle),
        "an idle peer was closed after {idle} s"
    );
    assert_eq!(
        slow["bad_hello"], "error: shim protocol version 99 is not supported (agent speaks 1)",
        "{slow}"
    );
    let bad = slow["bad_hello_closed_after_s"]
        .as_f64()
        .unwrap_or(f64::INFINITY);
    assert!(
        (9.0..13.0).contains(&bad),
        "a refused Hello's peer stayed {bad} s"
    );

    for a in attackers {
        a.finish();
    }
    shim.finish();
    assert!(
        agent.log_text().contains("fgpu agent ready"),
        "{}",
        agent.log_text()
    );
}

/// `(soft, hard)` limit on open files of `pid`, from /proc.
fn nofile(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    (f[3].to_string(), f[4].to_string())
}

fn prlimit(pid: u32, soft: &str, hard: &str) {
    let out = Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={soft}:{hard}"))
        .output()
        .expect("running prlimit");
    assert!(out.status.success(), "prlimit: {}", stderr(&out));
}

#[test]
fn privileged_running_out_of_descriptors_does_not_stop_the_agent() {
    if !privileged() {
        return;
    }
    let _timed = timed();
    let agent = Agent::start();
    let pid = agent.pid();
    let (soft, hard) = nofile(pid);
    // Leave the agent a handful of descriptors, then connect more peers than that.
    // (The soft limit only: raising a hard limit back needs CAP_SYS_RESOURCE.)
    let tight = (open_fds(pid) + 4).to_string();
    prlimit(pid, &tight, &hard);
    let peers: Vec<UnixStream> = (0..64)
        .map(|_| UnixStream::connect(&agent.socket).unwrap())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !agent
        .log_text()
        .contains("accepting a connection failed: Too many open files")
    {
        assert!(
            Instant::now() < deadline,
            "no EMFILE on accept:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    drop(peers);
    prlimit(pid, &soft, &hard);

    // Still serving: the host's status, and a new shim.
    let deadline = Instant::now() + Duration::from_secs(5);
    let ms = loop {
        match UnixStream::connect(&agent.admin) {
            Ok(_) => break status_round_trip(&agent.admin).0,
            Err(e) => assert!(
                Instant::now() < deadline,
                "the agent stopped serving: {e}\n{}",
                agent.log_text()
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("status after running out of descriptors: {ms:.2} ms");
    let state = SimState::new();
    let cg = Cgroup::new(&unique("fgpu-trust-after-emfile"));
    let python = common::find_python();
    let mut shim = Load::spawn_program(
        &cg,
        &state.0,
        &python,
        &["-c", HELLO, agent.socket.to_str().unwrap()],
    );
    let hello: serde_json::Value = serde_json::from_str(&shim.expect_line("{")).unwrap();
    assert_eq!(hello["kind"], 0x8010, "{hello}");
    assert_eq!(hello["cgroup"], cg.path.as_str(), "{hello}");
    shim.finish();
}

/// A tenant with no limit makes child cgroups (`flat`: DIR/c0, DIR/c1, ...; `chain`:
/// DIR/n, DIR/n/n, ...), moves itself into each and says Hello from it; with each ledger it
/// gets, it holds every slot lock through its own description of the usage memfd, raises the
/// high-water mark to every slot and marks slots used: every slot in its first FULL ledgers
/// (a ledger's slots are 1.1 MB of memory), the first 16 in the others. Prints
/// `{"made", "refusals", "secs"}` once done (or after 90 s), then holds everything.
const LEDGERS: &str = r#"
import fcntl, json, mmap, os, resource, socket, struct, sys, time
path, top, mode, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
hwm_off, slots_off, slot_size, used_off, lock_base, max_slots, full = map(int, sys.argv[5:12])
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
F_OFD_SETLK = 37
def enter(d):
    with open(os.path.join(d, "cgroup.procs"), "w") as f:
        f.write("0")
def hello():
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(b"FGPU" + struct.pack("<HHI", 1, 16, 8) + struct.pack("<II", 1, 0))
    s.settimeout(30)
    msg, fds, _, _ = socket.recv_fds(s, 65536, 4)
    s.close()
    kind, length = struct.unpack_from("<HI", msg, 6)
    text = (msg[20:12 + length] if kind == 0x8010 else msg[12:12 + length]).decode(errors="replace")
    return kind, text, fds
held, refusals, made = [], set(), 0
start, d = time.monotonic(), top
for i in range(n):
    if time.monotonic() - start > 90:
        break
    d = os.path.join(top, "c%d" % i) if mode == "flat" else os.path.join(d, "n")
    os.mkdir(d)
    enter(d)
    kind, text, fds = hello()
    if kind != 0x8010:
        refusals.add(text)
        continue
    made += 1
    own = os.open("/proc/self/fd/%d" % fds[1], os.O_RDWR)
    for fd in fds:
        os.close(fd)
    fcntl.fcntl(own, F_OFD_SETLK, struct.pack("hhxxxxqqi4x", fcntl.F_WRLCK, 0, lock_base, max_slots, 0))
    m = mmap.mmap(own, 0)
    struct.pack_into("<I", m, hwm_off, max_slots)
    for s in range(max_slots if made <= full else 16):
        struct.pack_into("<Q", m, slots_off + s * slot_size + used_off, 4096)
    m.close()
    held.append(own)
enter(top)
print(json.dumps({"made": made, "refusals": sorted(refusals), "secs": time.monotonic() - start}), flush=True)
sys.stdin.read()
"#;

/// Starts [`LEDGERS`] in `tenant`: `n` cgroups made the `mode` way, every slot of the first
/// `full` ledgers marked used.
fn ledger_attack(
    agent: &Agent,
    state: &SimState,
    tenant: &Cgroup,
    mode: &str,
    n: usize,
    full: usize,
) -> Load {
    use fgpu_common::ledger::{LOCK_BASE, Ledger, MAX_SLOTS, PAGE, Slot, Usage};
    let hwm = std::mem::offset_of!(Ledger, usage) - PAGE + std::mem::offset_of!(Usage, slots_hwm);
    let slots = std::mem::offset_of!(Ledger, slots) - PAGE;
    let args: Vec<String> = [
        agent.socket.to_str().unwrap().to_string(),
        tenant.dir.to_str().unwrap().to_string(),
        mode.to_string(),
        n.to_string(),
        hwm.to_string(),
        slots.to_string(),
        std::mem::size_of::<Slot>().to_string(),
        std::mem::offset_of!(Slot, used).to_string(),
        LOCK_BASE.to_string(),
        MAX_SLOTS.to_string(),
        full.to_string(),
    ]
    .into();
    let mut all = vec!["-c", LEDGERS];
    all.extend(args.iter().map(String::as_str));
    Load::spawn_program(tenant, &state.0, &common::find_python(), &all)
}

/// The CDI hook as a runtime runs it for a new container in `cg` asking for 1 GiB: (whether
/// it let the container start, its stderr, milliseconds).
fn cdi_hook(agent: &Agent, cg: &Cgroup) -> (bool, String, f64) {
    use std::io::Write;
    let mut cmd = Command::new("sleep");
    cmd.arg("30");
    cg.enter_on_exec(&mut cmd);
    let mut container = cmd.spawn().unwrap();
    let bundle = std::env::temp_dir().join(unique("fgpu-trust-bundle"));
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(
        bundle.join("config.json"),
        r#"{"ociVersion":"1.0.2","process":{"env":["PATH=/bin","FGPU_MEMORY_LIMIT=1GiB"]}}"#,
    )
    .unwrap();
    let oci_state = format!(
        r#"{{"ociVersion":"1.0.2","id":"0123456789abcdef","status":"creating","pid":{},"bundle":"{}"}}"#,
        container.id(),
        bundle.display()
    );
    let start = Instant::now();
    let mut hook = Command::new(env!("CARGO_BIN_EXE_fgpu"))
        .args(["cdi", "hook", "--admin-socket"])
        .arg(&agent.admin)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    hook.stdin
        .take()
        .unwrap()
        .write_all(oci_state.as_bytes())
        .unwrap();
    let out = hook.wait_with_output().unwrap();
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let _ = container.kill();
    let _ = container.wait();
    let _ = std::fs::remove_dir_all(&bundle);
    (out.status.success(), stderr(&out), ms)
}

/// Removes the cgroups below `dir`, the deepest first (after killing what runs there);
/// `dir` itself is left to its [`Cgroup`]'s drop.
fn remove_tree(dir: &std::path::Path) {
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    let mut dirs = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < dirs.len() {
        if let Ok(entries) = std::fs::read_dir(&dirs[i]) {
            dirs.extend(
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        i += 1;
    }
    for d in dirs.iter().skip(1).rev() {
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(d).is_err() && d.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The agent's CPU time so far (user + system), seconds.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// Host status round trips for `secs` seconds, 10 a second: the slowest, ms.
fn slowest_status(agent: &Agent, secs: f64) -> f64 {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut most: f64 = 0.0;
    while Instant::now() < until {
        most = most.max(status_round_trip(&agent.admin).0);
        std::thread::sleep(Duration::from_millis(100));
    }
    most
}

#[test]
fn privileged_a_tenants_many_cgroups_get_at_most_its_bound_of_ledgers_and_a_neighbour_still_gets_one()
 {
    if !privileged() {
        return;
    }
    let _timed = timed();
    let agent = Agent::start();
    let state = SimState::new();
    let tenant = Cgroup::new(&unique("fgpu-trust-ledgers"));
    let mut attack = ledger_attack(&agent, &state, &tenant, "flat", 80, 80);
    let seen: serde_json::Value = serde_json::from_str(&attack.expect_line("{")).unwrap();
    let newcomer = Cgroup::new(&unique("fgpu-trust-neighbour"));
    let python = common::find_python();
    let sock = agent.socket.to_str().unwrap();
    let mut shim = Load::spawn_program(&newcomer, &state.0, &python, &["-c", HELLO, sock]);
    let hello: serde_json::Value = serde_json::from_str(&shim.expect_line("{")).unwrap();
    let rtt = slowest_status(&agent, 2.0);
    eprintln!(
        "80 cgroups of one tenant, each saying Hello with every slot locked: {seen}; a \
         neighbour's Hello {hello}; host status at most {rtt:.1} ms"
    );
    assert_eq!(seen["made"], 64, "{seen}");
    assert_eq!(
        seen["refusals"],
        serde_json::json!([format!(
            "too many ledgers for {}: at most 64 at once per tenant (one per cgroup whose \
             processes say Hello; see fgpu agent --max-ledgers-per-tenant)",
            tenant.path
        )]),
        "{seen}"
    );
    assert_eq!(hello["kind"], 0x8010, "the neighbour was refused: {hello}");
    assert_eq!(hello["cgroup"], newcomer.path.as_str(), "{hello}");
    assert!(rtt < 100.0, "a status round trip took {rtt:.1} ms");
    shim.finish();
    attack.kill();
    remove_tree(&tenant.dir);
}

#[test]
fn privileged_a_thousand_ledgers_with_every_slot_locked_leave_status_and_the_cdi_hook_in_time() {
    if !privileged() {
        return;
    }
    let _timed = timed();
    let agent = Agent::start_with(&["--max-ledgers-per-tenant", "1000"]);
    let state = SimState::new();
    let tenant = Cgroup::new(&unique("fgpu-trust-thousand"));
    let mut attack = ledger_attack(&agent, &state, &tenant, "flat", 1000, 100);
    let seen: serde_json::Value = serde_json::from_str(&attack.expect_line("{")).unwrap();
    let rtt = slowest_status(&agent, 3.0);
    let container = Cgroup::new(&unique("fgpu-trust-newcontainer"));
    let (started, err, hook_ms) = cdi_hook(&agent, &container);
    eprintln!(
        "1000 ledgers of one tenant, every slot locked: {seen}; host status at most {rtt:.1} \
         ms; the CDI hook took {hook_ms:.0} ms"
    );
    assert_eq!(seen["made"], 1000, "{seen}");
    assert!(rtt < 100.0, "a status round trip took {rtt:.1} ms");
    assert!(started, "the CDI hook refused a new container: {err}");
    assert!(hook_ms < 1000.0, "the CDI hook took {hook_ms:.0} ms");
    attack.kill();
    remove_tree(&tenant.dir);
}

#[test]
fn privileged_a_chain_of_nested_cgroups_left_by_a_killed_tenant_costs_the_agent_nothing() {
    if !privileged() {
        return;
    }
    let _timed = timed();
    let agent = Agent::start();
    let state = SimState::new();
    let tenant = Cgroup::new(&unique("fgpu-trust-chain"));
    let mut attack = ledger_attack(&agent, &state, &tenant, "chain", 844, 64);
    let seen: serde_json::Value = serde_json::from_str(&attack.expect_line("{")).unwrap();
    attack.kill();
    // No attacker process is left; the 844 nested cgroups are.
    std::thread::sleep(Duration::from_millis(1500));
    let cpu_before = cpu_secs(agent.pid());
    let rtt = slowest_status(&agent, 3.0);
    let cpu = cpu_secs(agent.pid()) - cpu_before;
    let container = Cgroup::new(&unique("fgpu-trust-newcontainer"));
    let (started, err, hook_ms) = cdi_hook(&agent, &container);
    // The tenant's ledgers went with its processes: a new cgroup of it gets one.
    let again = Cgroup::new(&format!("{}/again", tenant.path.trim_start_matches('/')));
    let python = common::find_python();
    let sock = agent.socket.to_str().unwrap();
    let mut shim = Load::spawn_program(&again, &state.0, &python, &["-c", HELLO, sock]);
    let hello: serde_json::Value = serde_json::from_str(&shim.expect_line("{")).unwrap();
    eprintln!(
        "a chain of 844 nested cgroups, a Hello from each: {seen}; once its processes were \
         killed: host status at most {rtt:.1} ms, the agent used {cpu:.2} s of CPU in those \
         3 s, the CDI hook took {hook_ms:.0} ms; the tenant's next Hello: {hello}"
    );
    assert_eq!(seen["made"], 64, "{seen}");
    assert!(rtt < 100.0, "a status round trip took {rtt:.1} ms");
    assert!(started, "the CDI hook refused a new container: {err}");
    assert!(hook_ms < 1000.0, "the CDI hook took {hook_ms:.0} ms");
    assert!(cpu < 0.3, "the idle agent used {cpu:.2} s of CPU in 3 s");
    assert_eq!(hello["kind"], 0x8010, "the tenant was refused: {hello}");
    shim.finish();
    drop(again);
    remove_tree(&tenant.dir);
}
