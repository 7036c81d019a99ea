//! The agent's two sockets: the containers' socket (mode 0666, alone in a 0755 directory,
//! as `agent::server::bind_containers` makes it) and the admin socket (root's, 0600, or 0660
//! with `--socket-group`, in a 0700 directory: `bind_admin`), and an agent answering on both
//! (the CLI's own client, with a deadline).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use fgpu_common::proto::Kind;

use super::{Check, Paths};
use crate::status::StatusReport;

pub fn checks(p: &Paths) -> Vec<Check> {
    vec![containers_socket(p), admin_socket(p), agent(p)]
}

fn start_fix(p: &Paths) -> String {
    format!(
        "start the agent: `sudo fgpu agent{}` (if it runs with --socket or --admin-socket, give \
         this check the same)",
        p.sim_flag()
    )
}

const RESTART_FIX: &str = "look at the agent's log (journalctl, `kubectl logs`) and restart it";
const SUDO_FIX: &str = "run `sudo fgpu doctor` to check the node as the agent sees it";

fn mode(m: &std::fs::Metadata) -> u32 {
    m.mode() & 0o7777
}

fn containers_socket(p: &Paths) -> Check {
    const NAME: &str = "containers-socket";
    let path = &p.socket;
    let Some(dir) = path.parent() else {
        return Check::fail(
            NAME,
            format!("{}: not a full path", path.display()),
            "give --socket the socket's full path",
        );
    };
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Check::fail(
                NAME,
                format!(
                    "no socket at {}: shims cannot reach an agent",
                    path.display()
                ),
                start_fix(p),
            );
        }
        Err(e) => {
            return Check::warn(NAME, format!("{}: {e}", path.display()), SUDO_FIX);
        }
    };
    if !meta.file_type().is_socket() {
        return Check::fail(
            NAME,
            format!("{} is not a socket", path.display()),
            format!(
                "remove it (`rm {}`) and restart the agent, which binds its socket there",
                path.display()
            ),
        );
    }
    let dir_meta = match std::fs::metadata(dir) {
        Ok(m) => m,
        Err(e) => return Check::warn(NAME, format!("{}: {e}", dir.display()), SUDO_FIX),
    };
    if dir_meta.uid() != 0 || mode(&dir_meta) & 0o022 != 0 {
        return Check::fail(
            NAME,
            format!(
                "{} (owner uid {}, mode {:04o}) may be written by others than root: anyone \
                 could put another socket in the agent's place",
                dir.display(),
                dir_meta.uid(),
                mode(&dir_meta)
            ),
            format!(
                "`chown root {0} && chmod 0755 {0}` (the mode the agent makes it)",
                dir.display()
            ),
        );
    }
    if mode(&meta) != 0o666 {
        return Check::warn(
            NAME,
            format!(
                "{} has mode {:04o}, not the 0666 the agent binds it with: shims of other users \
                 cannot connect",
                path.display(),
                mode(&meta)
            ),
            "restart the agent, which binds the containers' socket with mode 0666",
        );
    }
    let mut others: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| Some(n.as_str()) != path.file_name().and_then(|f| f.to_str()))
                .collect()
        })
        .unwrap_or_default();
    others.sort();
    if !others.is_empty() {
        return Check::warn(
            NAME,
            format!(
                "{} is mounted into containers and holds more than the socket: {}",
                dir.display(),
                others.join(", ")
            ),
            "move the other files out, or give the agent a --socket in a directory of its own",
        );
    }
    Check::ok(
        NAME,
        format!(
            "{}: mode 0666, alone in {} (mode {:04o})",
            path.display(),
            dir.display(),
            mode(&dir_meta)
        ),
    )
}

fn admin_socket(p: &Paths) -> Check {
    const NAME: &str = "admin-socket";
    let path = &p.admin_socket;
    // The agent's own rule: never inside the containers' socket directory.
    if let Err(err) = crate::agent::server::check_paths(path, &p.socket) {
        return Check::fail(
            NAME,
            format!("{err:#}"),
            "give the agent an --admin-socket in a directory of its own, e.g. \
             /run/fgpu-admin/fgpu.sock",
        );
    }
    let dir = path.parent().expect("check_paths wants a parent");
    let dir_meta = match std::fs::metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Check::fail(
                NAME,
                format!(
                    "no socket at {} ({} does not exist)",
                    path.display(),
                    dir.display()
                ),
                start_fix(p),
            );
        }
        Err(e) => return Check::warn(NAME, format!("{}: {e}", dir.display()), SUDO_FIX),
    };
    let dir_mode = mode(&dir_meta);
    if dir_meta.uid() != 0 || dir_mode & 0o022 != 0 {
        return Check::fail(
            NAME,
            format!(
                "{} (owner uid {}, mode {dir_mode:04o}) may be written by others than root: \
                 anyone could put another socket in the agent's place",
                dir.display(),
                dir_meta.uid()
            ),
            format!(
                "`chown root {0} && chmod 0700 {0}` (the mode the agent makes it)",
                dir.display()
            ),
        );
    }
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Check::fail(
                NAME,
                format!("no socket at {}", path.display()),
                start_fix(p),
            );
        }
        Err(e) => {
            return Check::warn(
                NAME,
                format!(
                    "cannot look inside {} (mode {dir_mode:04o}): {e}",
                    dir.display()
                ),
                SUDO_FIX,
            );
        }
    };
    if !meta.file_type().is_socket() {
        return Check::fail(
            NAME,
            format!("{} is not a socket", path.display()),
            format!(
                "remove it (`rm {}`) and restart the agent, which binds its socket there",
                path.display()
            ),
        );
    }
    let sock_mode = mode(&meta);
    if sock_mode & 0o007 != 0 || meta.uid() != 0 {
        return Check::fail(
            NAME,
            format!(
                "{} (owner uid {}, mode {sock_mode:04o}) is open to other users: they could set \
                 limits and read every cgroup's status",
                path.display(),
                meta.uid()
            ),
            format!(
                "`chown root {0} && chmod 0600 {0}`, or restart the agent as root (it binds the \
                 admin socket 0600, 0660 with --socket-group)",
                path.display()
            ),
        );
    }
    if dir_mode & 0o007 != 0 {
        return Check::warn(
            NAME,
            format!(
                "{} has mode {dir_mode:04o}: other users may look into the admin socket's \
                 directory (the agent makes it 0700)",
                dir.display()
            ),
            format!("`chmod 0700 {}`", dir.display()),
        );
    }
    let group = if sock_mode & 0o070 != 0 {
        format!(", group {} may use it (--socket-group)", meta.gid())
    } else {
        String::new()
    };
    Check::ok(
        NAME,
        format!(
            "{}: root's, mode {sock_mode:04o}{group}, in {} (mode {dir_mode:04o})",
            path.display(),
            dir.display()
        ),
    )
}

/// The answer to a status request on one socket, on its way.
enum Asked {
    Now(Result<StatusReport, String>),
    Waiting(mpsc::Receiver<Result<StatusReport, String>>),
}

/// Sends a status request on `socket` through the CLI's client, on a thread of its own: a
/// hung agent must not hold the report up for the client's own read timeout.
fn ask(socket: &Path) -> Asked {
    if std::fs::symlink_metadata(socket).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        return Asked::Now(Err(format!("no socket at {}", socket.display())));
    }
    let (tx, rx) = mpsc::channel();
    let path = socket.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("fgpu-doctor-ask".into())
        .spawn(move || {
            let reply = super::super::client::request(
                &path,
                Kind::StatusRequest,
                Bytes::new(),
                Kind::StatusReply,
            )
            .and_then(|payload| {
                serde_json::from_slice::<StatusReport>(&payload)
                    .context("the agent's status reply is not valid")
            });
            let _ = tx.send(reply.map_err(|e| format!("{e:#}")));
        });
    match spawned {
        Ok(_) => Asked::Waiting(rx),
        Err(err) => Asked::Now(Err(format!("cannot start a thread to ask: {err}"))),
    }
}

/// The answer, if it comes by `deadline`.
fn answer(
    asked: Asked,
    socket: &Path,
    deadline: Instant,
    timeout: Duration,
) -> Result<StatusReport, String> {
    match asked {
        Asked::Now(r) => r,
        Asked::Waiting(rx) => rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| {
                Err(format!(
                    "{}: no answer within {} ms",
                    socket.display(),
                    timeout.as_millis()
                ))
            }),
    }
}

fn agent(p: &Paths) -> Check {
    const NAME: &str = "agent";
    // Both at once, under one deadline.
    let deadline = Instant::now() + p.timeout;
    let (admin, containers) = (ask(&p.admin_socket), ask(&p.socket));
    let admin = answer(admin, &p.admin_socket, deadline, p.timeout);
    let containers = answer(containers, &p.socket, deadline, p.timeout);
    let hung = |e: &str| e.contains("no answer within");
    match (admin, containers) {
        (Ok(report), Ok(_)) => {
            let libraries = if report.libraries.is_empty() {
                "no library".to_string()
            } else {
                report.libraries.join(", ")
            };
            Check::ok(
                NAME,
                format!(
                    "answering on {} ({} cgroups; probing {libraries}) and on {}",
                    p.admin_socket.display(),
                    report.cgroups.len(),
                    p.socket.display()
                ),
            )
        }
        (Err(a), Ok(_)) if a.contains("permission denied") => Check::warn(
            NAME,
            format!(
                "answering on {}; the admin socket refused this user ({a})",
                p.socket.display()
            ),
            SUDO_FIX,
        ),
        (Err(a), Err(c)) if !hung(&a) && !hung(&c) => {
            Check::fail(NAME, format!("not answering: {a}; {c}"), start_fix(p))
        }
        (Ok(_), Err(c)) => Check::fail(
            NAME,
            format!("answering on the admin socket only (containers' socket: {c})"),
            RESTART_FIX,
        ),
        (Err(a), Ok(_)) => Check::fail(
            NAME,
            format!("answering on the containers' socket only (admin socket: {a})"),
            RESTART_FIX,
        ),
        (Err(a), Err(c)) => Check::fail(
            NAME,
            format!("not answering (admin socket: {a}; containers' socket: {c})"),
            RESTART_FIX,
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixListener;

    use super::super::Status;
    use super::super::tests::Tree;
    use super::*;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Both sockets bound as the agent binds them; the listeners keep them alive.
    fn bound(t: &Tree) -> (Paths, UnixListener, UnixListener) {
        let p = t.paths();
        let c_dir = t.mkdir("/run/fgpu");
        let a_dir = t.mkdir("/run/fgpu-admin");
        chmod(&c_dir, 0o755);
        chmod(&a_dir, 0o700);
        let c = UnixListener::bind(&p.socket).unwrap();
        let a = UnixListener::bind(&p.admin_socket).unwrap();
        chmod(&p.socket, 0o666);
        chmod(&p.admin_socket, 0o600);
        (p, c, a)
    }

    #[test]
    fn privileged_sockets_as_the_agent_makes_them_are_ok() {
        // The owner checks need root-owned files.
        if !fgpu_testkit::privileged() {
            return;
        }
        let t = Tree::new("sockets-ok");
        let (p, _c, _a) = bound(&t);
        let c = containers_socket(&p);
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert_eq!(
            c.detail,
            format!(
                "{}: mode 0666, alone in {} (mode 0755)",
                p.socket.display(),
                p.socket.parent().unwrap().display()
            )
        );
        let a = admin_socket(&p);
        assert_eq!(a.status, Status::Ok, "{a:?}");
        assert_eq!(
            a.detail,
            format!(
                "{}: root's, mode 0600, in {} (mode 0700)",
                p.admin_socket.display(),
                p.admin_socket.parent().unwrap().display()
            )
        );
    }

    #[test]
    fn privileged_wrong_modes_and_owners_are_reported_with_their_fix() {
        if !fgpu_testkit::privileged() {
            return;
        }
        let t = Tree::new("sockets-modes");
        let (p, _c, _a) = bound(&t);

        chmod(&p.admin_socket, 0o666);
        let open = admin_socket(&p);
        assert_eq!(open.status, Status::Fail);
        assert_eq!(
            open.fix,
            Some(format!(
                "`chown root {0} && chmod 0600 {0}`, or restart the agent as root (it binds the \
                 admin socket 0600, 0660 with --socket-group)",
                p.admin_socket.display()
            ))
        );
        chmod(&p.admin_socket, 0o660);
        assert!(
            admin_socket(&p)
                .detail
                .contains(", group 0 may use it (--socket-group)"),
            "group access is the agent's --socket-group"
        );
        chmod(&p.admin_socket, 0o600);

        let a_dir = p.admin_socket.parent().unwrap();
        chmod(a_dir, 0o755);
        let looked_into = admin_socket(&p);
        assert_eq!(looked_into.status, Status::Warn);
        assert_eq!(
            looked_into.fix,
            Some(format!("`chmod 0700 {}`", a_dir.display()))
        );
        chmod(a_dir, 0o777);
        let writable = admin_socket(&p);
        assert_eq!(writable.status, Status::Fail);
        assert_eq!(
            writable.fix,
            Some(format!(
                "`chown root {0} && chmod 0700 {0}` (the mode the agent makes it)",
                a_dir.display()
            ))
        );
        chmod(a_dir, 0o700);
        std::os::unix::fs::chown(&p.admin_socket, Some(65534), None).unwrap();
        assert_eq!(admin_socket(&p).status, Status::Fail, "not root's");

        chmod(&p.socket, 0o600);
        let narrow = containers_socket(&p);
        assert_eq!(narrow.status, Status::Warn);
        assert_eq!(
            narrow.fix.as_deref(),
            Some("restart the agent, which binds the containers' socket with mode 0666")
        );
        chmod(&p.socket, 0o666);
        t.write("/run/fgpu/secret.key", "x");
        let crowded = containers_socket(&p);
        assert_eq!(crowded.status, Status::Warn);
        assert!(
            crowded
                .detail
                .ends_with("holds more than the socket: secret.key")
        );
    }

    #[test]
    fn missing_sockets_and_an_admin_socket_inside_the_containers_directory_fail() {
        let t = Tree::new("sockets-missing");
        let mut p = t.paths();
        let c = containers_socket(&p);
        assert_eq!(c.status, Status::Fail);
        assert_eq!(
            c.fix.as_deref(),
            Some(
                "start the agent: `sudo fgpu agent` (if it runs with --socket or \
                 --admin-socket, give this check the same)"
            )
        );
        assert_eq!(admin_socket(&p).status, Status::Fail);
        let agent = agent(&p);
        assert_eq!(agent.status, Status::Fail);
        assert_eq!(
            agent.detail,
            format!(
                "not answering: no socket at {}; no socket at {}",
                p.admin_socket.display(),
                p.socket.display()
            )
        );
        p.sim = true;
        assert_eq!(
            agent_fix(&p),
            "start the agent: `sudo fgpu agent --sim` (if it runs with --socket or \
             --admin-socket, give this check the same)"
        );

        p.admin_socket = t.0.join("run/fgpu/admin.sock");
        let inside = admin_socket(&p);
        assert_eq!(inside.status, Status::Fail);
        assert!(
            inside
                .detail
                .contains("is inside the containers' socket directory"),
            "{}",
            inside.detail
        );
        assert_eq!(
            inside.fix.as_deref(),
            Some(
                "give the agent an --admin-socket in a directory of its own, e.g. \
                 /run/fgpu-admin/fgpu.sock"
            )
        );
    }

    fn agent_fix(p: &Paths) -> String {
        agent(p).fix.unwrap()
    }

    #[test]
    fn a_socket_that_never_answers_is_a_hung_agent() {
        let t = Tree::new("sockets-hung");
        // Bound but never accepted: connecting works, no reply ever comes.
        let (p, _c, _a) = bound(&t);
        let check = agent(&p);
        assert_eq!(check.status, Status::Fail);
        assert!(
            check.detail.starts_with("not answering (admin socket: "),
            "{}",
            check.detail
        );
        assert!(
            check.detail.contains("no answer within 500 ms"),
            "{}",
            check.detail
        );
        assert_eq!(
            check.fix.as_deref(),
            Some("look at the agent's log (journalctl, `kubectl logs`) and restart it")
        );
    }

    #[test]
    fn an_agent_answering_on_one_socket_only_fails() {
        use std::io::{Read, Write};
        let t = Tree::new("sockets-one");
        let (p, c, a) = bound(&t);
        drop(c);
        std::fs::remove_file(&p.socket).unwrap();
        // A stand-in agent: one status reply on the admin socket.
        let server = std::thread::spawn(move || {
            let (mut conn, _) = a.accept().unwrap();
            let mut buf = [0u8; 64];
            let _ = conn.read(&mut buf).unwrap();
            let report = serde_json::to_vec(&StatusReport::default()).unwrap();
            let mut out = bytes::BytesMut::new();
            fgpu_common::proto::Frame::new(Kind::StatusReply, report)
                .encode(&mut out)
                .unwrap();
            conn.write_all(&out).unwrap();
        });
        let check = agent(&p);
        server.join().unwrap();
        assert_eq!(check.status, Status::Fail);
        assert_eq!(
            check.detail,
            format!(
                "answering on the admin socket only (containers' socket: no socket at {})",
                p.socket.display()
            )
        );
        assert_eq!(check.fix.as_deref(), Some(RESTART_FIX));
    }
}
