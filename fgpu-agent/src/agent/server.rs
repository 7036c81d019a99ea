//! The agent's sockets: one request frame in, one reply frame out, per connection turn.
//!
//! Two doors ([`Door`]) share this code: the containers' socket and the admin socket. Each
//! connection is identified once ([`Caller`]: everything said about the caller later goes by
//! that identity and its pidfd, never by its PID again), admitted against the door's
//! connection caps (per tenant, [`super::tenant`]), allowed one Hello, and bounded in frame
//! size, descriptors and time ([`Limits`]). Control requests are
//! answered on the blocking pool, a few at a time per door, and so is finding (or making) a
//! Hello's ledger, so that they never hold up the kernel-event path that shares this thread.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::BytesMut;
use std::os::fd::OwnedFd;

use fgpu_common::proto::{Frame, Kind, shim};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::time::{Instant, timeout, timeout_at};

use super::control;
use super::doors::{Admitted, Budget, Door, Limits};
use super::logging::Ration;
use super::peer::Caller;
use super::scm;
use super::state::State;

/// Binds the containers' socket (mode 0666: shims inside containers, running as any user,
/// introduce themselves on it), refusing to take over from a running agent.
pub fn bind_containers(path: &Path) -> Result<UnixListener> {
    let dir = parent(path)?;
    if !dir.exists() {
        create_dir(dir, 0o755)?;
    }
    let listener = bind_as(path, 0o666, None)?;
    let others: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| Some(n.as_str()) != path.file_name().and_then(|f| f.to_str()))
                .collect()
        })
        .unwrap_or_default();
    if !others.is_empty() {
        tracing::warn!(
            dir = %dir.display(),
            ?others,
            "the containers' socket is not alone in its directory: whatever is mounted into \
             containers with it is exposed to them"
        );
    }
    Ok(listener)
}

/// Binds the admin socket: mode 0600 (0660 and the group's with `--socket-group`), in a
/// directory made 0700 (0750) if the agent creates it. It must not lie inside the containers'
/// socket directory, which is mounted into containers.
pub fn bind_admin(path: &Path, containers: &Path, group: Option<u32>) -> Result<UnixListener> {
    check_paths(path, containers)?;
    let dir = parent(path)?;
    if !dir.exists() {
        create_dir(dir, if group.is_some() { 0o750 } else { 0o700 })?;
        if let Some(gid) = group {
            chown_group(dir, gid)?;
        }
    }
    bind_as(path, if group.is_some() { 0o660 } else { 0o600 }, group)
}

/// Refuses an admin socket inside the containers' socket directory (checked at start, before
/// anything is loaded, and again at bind).
pub fn check_paths(admin: &Path, containers: &Path) -> Result<()> {
    let containers_dir = parent(containers)?;
    parent(admin)?;
    if absolute(admin).starts_with(absolute(containers_dir)) {
        bail!(
            "--admin-socket {} is inside the containers' socket directory {} (which is mounted \
             into containers): put it in a directory of its own, e.g. {}",
            admin.display(),
            containers_dir.display(),
            crate::DEFAULT_ADMIN_SOCKET
        );
    }
    Ok(())
}

fn parent(path: &Path) -> Result<&Path> {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .with_context(|| format!("{}: give the socket's full path", path.display()))
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

fn create_dir(dir: &Path, mode: u32) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", dir.display()))
}

fn chown_group(path: &Path, gid: u32) -> Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: chown on a NUL-terminated path; uid -1 leaves the owner as it is.
    if unsafe { libc::chown(c.as_ptr(), u32::MAX, gid) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("giving {} to group {gid}", path.display()));
    }
    Ok(())
}

/// Binds under a temporary name, sets the mode (and group), then renames into place: the
/// socket is never reachable with a wider mode than `mode`.
fn bind_as(path: &Path, mode: u32, group: Option<u32>) -> Result<UnixListener> {
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        bail!(
            "another fgpu agent is already serving {} (stop it first, or use --socket and \
             --admin-socket)",
            path.display()
        );
    }
    let tmp = path.with_extension(format!("binding-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener =
        UnixListener::bind(&tmp).with_context(|| format!("binding {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
    if let Some(gid) = group {
        chown_group(&tmp, gid)?;
    }
    // A stale socket from an agent that died is replaced.
    std::fs::rename(&tmp, path).with_context(|| format!("binding {}", path.display()))?;
    Ok(listener)
}

/// Serves one door until the process ends. Accept errors (EMFILE included) are logged and
/// waited out; they never end the server.
pub async fn serve(listener: UnixListener, door: Door, limits: Limits, state: Arc<State>) {
    let limits = Arc::new(limits);
    let budget = Budget::new(limits.max_connections, limits.max_per_caller);
    let work = Arc::new(Semaphore::new(limits.concurrent_requests));
    let mut last_warn: Option<Instant> = None;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(err) => {
                // Out of descriptors or memory: the connection waits in the backlog; wait a
                // little instead of spinning, and say so at most once a second.
                if last_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    tracing::warn!(door = door.name(), "accepting a connection failed: {err}");
                    last_warn = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let conn = Conn {
            state: Arc::clone(&state),
            limits: Arc::clone(&limits),
            budget: Arc::clone(&budget),
            work: Arc::clone(&work),
        };
        tokio::spawn(async move {
            if let Err(err) = conn.handle(stream, door).await {
                tracing::debug!(door = door.name(), "connection ended: {err:#}");
            }
        });
    }
}

/// What a connection's task shares with its door.
struct Conn {
    state: Arc<State>,
    limits: Arc<Limits>,
    budget: Arc<Budget>,
    work: Arc<Semaphore>,
}

impl Conn {
    async fn handle(self, stream: UnixStream, door: Door) -> Result<()> {
        let caller = Arc::new(Caller::identify(&stream, door)?);
        let _admitted: Admitted = match self.budget.admit(&super::tenant::key(&self.state, &caller))
        {
            Ok(a) => a,
            Err(why) => {
                tracing::debug!(
                    door = door.name(),
                    uid = caller.peer.uid,
                    pid = caller.peer.pid,
                    caller_cgroup = caller.cgroup_or_dash(),
                    "refused a connection: {why}"
                );
                self.send(&stream, Frame::new(Kind::Error, why)).await?;
                return Ok(());
            }
        };
        let limits = &self.limits;
        let mut buf = BytesMut::with_capacity(4096);
        let mut chunk = vec![0u8; limits.max_frame.min(64 << 10) + 64];
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut said_hello = false;
        let mut hellos = 0u32;
        // Once a shim holds its connection idle: the end of the process that connected.
        let mut peer_exit: Option<PeerExit> = None;
        loop {
            let mut frame_deadline: Option<Instant> = None;
            let frame = loop {
                match Frame::decode_max(&mut buf, limits.max_frame) {
                    Ok(Some(frame)) => break frame,
                    Ok(None) => {}
                    Err(err) => {
                        self.send(&stream, Frame::new(Kind::Error, err.to_string()))
                            .await?;
                        return Err(err.into());
                    }
                }
                if !buf.is_empty() && frame_deadline.is_none() {
                    frame_deadline = Some(Instant::now() + limits.frame_timeout);
                }
                let recv = scm::recv(&stream, &mut chunk);
                let received = match (frame_deadline, said_hello) {
                    (Some(deadline), _) => timeout_at(deadline, recv).await.map_err(|_| {
                        anyhow::anyhow!(
                            "a frame took longer than {:?} to arrive",
                            limits.frame_timeout
                        )
                    })?,
                    (None, false) => timeout(limits.idle_timeout, recv).await.map_err(|_| {
                        anyhow::anyhow!("idle for {:?} without a request", limits.idle_timeout)
                    })?,
                    // A shim holds its connection open to notice an agent restart, for as
                    // long as the process that connected lives (a fork child that kept it
                    // notices the close and says Hello again, as itself).
                    (None, true) => {
                        let exit = peer_exit.get_or_insert_with(|| PeerExit::new(&caller));
                        tokio::select! {
                            r = recv => r,
                            () = exit.wait() => {
                                tracing::debug!(
                                    door = door.name(),
                                    pid = caller.peer.pid,
                                    caller_cgroup = caller.cgroup_or_dash(),
                                    "closing a shim's connection: {PEER_EXITED}"
                                );
                                let bye = Frame::new(Kind::Error, PEER_EXITED);
                                let _ = self.send(&stream, bye).await;
                                return Ok(());
                            }
                        }
                    }
                };
                let (n, received) = match received {
                    Ok(r) => r,
                    Err(err) if err.kind() == std::io::ErrorKind::InvalidData => {
                        self.send(&stream, Frame::new(Kind::Error, err.to_string()))
                            .await?;
                        return Err(err.into());
                    }
                    Err(err) => return Err(err.into()),
                };
                if n == 0 {
                    return Ok(());
                }
                buf.extend_from_slice(&chunk[..n]);
                if fds.len() + received.len() > limits.max_fds {
                    drop(received); // closed at once
                    let msg = format!(
                        "too many file descriptors: at most {} per request",
                        limits.max_fds
                    );
                    self.send(&stream, Frame::new(Kind::Error, msg.clone()))
                        .await?;
                    bail!(msg);
                }
                fds.extend(received);
            };
            if frame.kind == Kind::Hello {
                hellos += 1;
                if hellos > 1 {
                    // One Hello per connection: a shim connects again for another ledger, so
                    // that every answer is about the caller identified at this accept.
                    drop(std::mem::take(&mut fds));
                    self.send(&stream, Frame::new(Kind::Error, SECOND_HELLO))
                        .await?;
                    bail!(SECOND_HELLO);
                }
                // Only a Hello that got its ledger earns the shim's right to hold the
                // connection idle (a refused one is answered once, then the idle timeout
                // applies: a caller that has exited gets one "has exited", not two).
                let fds = std::mem::take(&mut fds);
                said_hello |= timeout(
                    limits.write_timeout,
                    hello(&stream, &self.state, &caller, frame, fds),
                )
                .await
                .context("the shim did not take its ledger")??;
                continue;
            }
            fds.clear(); // descriptors only ever come with a Hello
            let answer = self.answer(&caller, frame).await;
            self.send(&stream, answer).await?;
        }
    }

    /// Answers a control request on the blocking pool, at most `concurrent_requests` at once
    /// per door.
    async fn answer(&self, caller: &Arc<Caller>, frame: Frame) -> Frame {
        let Ok(_permit) = self.work.acquire().await else {
            return Frame::new(Kind::Error, "the agent is shutting down");
        };
        let state = Arc::clone(&self.state);
        let caller = Arc::clone(caller);
        tokio::task::spawn_blocking(move || control::answer(&state, &caller, &frame))
            .await
            .unwrap_or_else(|err| Frame::new(Kind::Error, format!("internal error: {err}")))
    }

    /// Sends one frame, giving up if the peer does not take it in time.
    async fn send(&self, stream: &UnixStream, frame: Frame) -> Result<()> {
        timeout(self.limits.write_timeout, reply(stream, frame))
            .await
            .context("the peer did not take its reply")?
    }
}

/// A shim introduces itself: hand over the ledger whose budget its cgroup is under. The
/// cgroup is the one read at accept and confirmed through the caller's pidfd (the kernel's
/// word, not the shim's), never read again by PID; a caller whose process has exited since
/// is refused (its PID may name a process of another cgroup by now). The ledger is found
/// (or made, which may adopt a page and plan its budget) on the blocking pool, never on the
/// thread that serves the sockets and the kernel's events. Returns whether the shim got its
/// ledger.
async fn hello(
    stream: &UnixStream,
    state: &Arc<State>,
    caller: &Arc<Caller>,
    frame: Frame,
    fds: Vec<OwnedFd>,
) -> Result<bool> {
    let peer = caller.peer;
    let tenant_of_caller = {
        let (state, caller) = (Arc::clone(state), Arc::clone(caller));
        move || super::tenant::key(&state, &caller)
    };
    let (state, caller) = (Arc::clone(state), Arc::clone(caller));
    let ledger = tokio::task::spawn_blocking(move || -> Result<_> {
        let hello = shim::HelloPayload::decode(&frame.payload).context("malformed Hello")?;
        if hello.version != shim::VERSION {
            bail!(
                "shim protocol version {} is not supported (agent speaks {})",
                hello.version,
                shim::VERSION
            );
        }
        let pid = peer.pid.context("no peer credentials on the socket")?;
        // No pidfd: the process had exited before it was identified (SO_PEERPIDFD's ESRCH).
        let pidfd = match &caller.pidfd {
            Some(fd) if super::pidfd::alive(fd) => Arc::clone(fd),
            _ => bail!(PEER_EXITED),
        };
        let cgroup = caller
            .cgroup
            .as_deref()
            .context("the caller's cgroup v2 could not be read when it connected")?;
        let usage = (hello.flags & shim::HELLO_HAS_USAGE_FD != 0)
            .then(|| fds.into_iter().next())
            .flatten();
        // The ledger of the nearest limited cgroup, or the process's own (budget.rs).
        super::budget::ledger_of(&state, (pid, pidfd), cgroup, usage)
    })
    .await
    .unwrap_or_else(|err| Err(anyhow::anyhow!("internal error: {err}")));
    match ledger {
        Ok(ledger) => {
            tracing::debug!(pid = peer.pid, cgroup = %ledger.cgroup, "shim connected");
            let mut out = BytesMut::new();
            Frame::new(Kind::LedgerReply, shim::encode_ledger_reply(&ledger.cgroup))
                .encode(&mut out)?;
            scm::send(stream, &out, &ledger.fds()).await?;
            Ok(true)
        }
        Err(err) => {
            // A tenant can make refusals as fast as it can connect: its log lines are rationed.
            let tenant = tenant_of_caller();
            if let Some(unlogged) = REFUSALS.admit(&tenant, fgpu_common::clock::mono_ms()) {
                tracing::warn!(pid = peer.pid, %tenant, unlogged, "refused a shim: {err:#}");
            }
            reply(stream, Frame::new(Kind::Error, format!("{err:#}"))).await?;
            Ok(false)
        }
    }
}

/// The shim refusals logged: one a tenant per [`RefusalLog::EVERY_MS`].
static REFUSALS: RefusalLog = RefusalLog::new();

/// The log lines of refused Hellos, rationed per tenant ([`Ration`]); at most
/// [`RefusalLog::TENANTS`] tenants remembered (past that, refusals of tenants not seen in the
/// last period go unlogged until one is forgotten).
struct RefusalLog(std::sync::Mutex<Option<std::collections::HashMap<String, Ration>>>);

impl RefusalLog {
    const EVERY_MS: u64 = 10_000;
    const TENANTS: usize = 1024;

    const fn new() -> Self {
        Self(std::sync::Mutex::new(None))
    }

    /// Whether to log a refusal of `tenant` at `now_ms`: `Some(n)`, n refusals left unlogged
    /// since its last line; `None`: count it and say nothing.
    fn admit(&self, tenant: &str, now_ms: u64) -> Option<u64> {
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let seen = guard.get_or_insert_with(Default::default);
        if let Some(ration) = seen.get_mut(tenant) {
            return ration.admit(now_ms, Self::EVERY_MS);
        }
        if seen.len() >= Self::TENANTS {
            seen.retain(|_, ration| ration.quiet(now_ms));
            if seen.len() >= Self::TENANTS {
                return None;
            }
        }
        seen.entry(tenant.to_string())
            .or_default()
            .admit(now_ms, Self::EVERY_MS)
    }
}

/// Why a held connection is closed, or a Hello on it refused, once its process has exited.
const PEER_EXITED: &str =
    "the process that opened this connection has exited: connect again for a ledger";
/// The answer to a second Hello on one connection.
const SECOND_HELLO: &str =
    "this connection has already said Hello: connect again for another ledger";

/// The end of the process that opened a connection: its pidfd becomes readable when it
/// exits (polled by the runtime, no timer); where the pidfd cannot be polled, it is checked
/// every few seconds. A caller without a pidfd is never taken for dead.
struct PeerExit {
    polled: Option<AsyncFd<Arc<OwnedFd>>>,
    pidfd: Option<Arc<OwnedFd>>,
}

impl PeerExit {
    fn new(caller: &Caller) -> Self {
        let pidfd = caller.pidfd.clone();
        let polled = pidfd.as_ref().and_then(|fd| {
            // SAFETY: the Arc keeps the pidfd open, and `as_raw_fd` returns that same
            // descriptor, for as long as the AsyncFd that owns this clone lives.
            unsafe { AsyncFd::register_with_interest(Arc::clone(fd), Interest::READABLE) }.ok()
        });
        Self { polled, pidfd }
    }

    async fn wait(&mut self) {
        match (&self.polled, &self.pidfd) {
            (Some(fd), _) => {
                // Readable for good once the process is gone; an error is taken as gone too.
                let _ = fd.readable().await;
            }
            (None, Some(pidfd)) => {
                while super::pidfd::alive(pidfd) {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
            (None, None) => std::future::pending().await,
        }
    }
}

async fn reply(stream: &UnixStream, frame: Frame) -> Result<()> {
    let mut out = BytesMut::new();
    frame.encode(&mut out)?;
    scm::send(stream, &out, &[]).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn refusals_are_logged_once_per_period_per_tenant_with_the_count_left_out() {
        let log = super::RefusalLog::new();
        let (t0, every) = (1_000, super::RefusalLog::EVERY_MS);
        assert_eq!(log.admit("/a", t0), Some(0));
        for _ in 0..500 {
            assert_eq!(log.admit("/a", t0), None);
        }
        // Another tenant is not held back by /a's flood.
        assert_eq!(log.admit("/b", t0), Some(0));
        assert_eq!(log.admit("/a", t0 + every), Some(500));
        assert_eq!(log.admit("/a", t0 + every), None);
        // Remembering is bounded: past TENANTS recent ones, a new tenant goes unlogged.
        for i in 0..super::RefusalLog::TENANTS {
            log.admit(&format!("/t{i}"), t0 + every);
        }
        assert_eq!(log.admit("/new", t0 + every), None);
        assert_eq!(log.admit("/new", t0 + every * 3), Some(0));
    }

    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn sockets_get_their_modes_and_a_running_agent_is_not_taken_over() {
        let base = std::env::temp_dir().join(format!("fgpu-server-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let containers = base.join("run/fgpu.sock");
        let admin = base.join("admin/fgpu.sock");
        let _c = bind_containers(&containers).unwrap();
        let _a = bind_admin(&admin, &containers, None).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&containers), 0o666);
        assert_eq!(mode(&admin), 0o600);
        assert_eq!(mode(admin.parent().unwrap()), 0o700);
        let again = bind_containers(&containers).unwrap_err().to_string();
        assert!(
            again.contains("another fgpu agent is already serving"),
            "{again}"
        );
        let inside = bind_admin(&base.join("run/admin.sock"), &containers, None)
            .unwrap_err()
            .to_string();
        assert!(
            inside.contains("inside the containers' socket directory"),
            "{inside}"
        );
        let _ = std::fs::remove_dir_all(&base);
    }
}
