//! Handing file descriptors (a CUDA VMM allocation exported as a POSIX fd, or the memfd behind a
//! CPU-emulated PE's shared memory) to the other processes of this node: each process serves its
//! descriptor on an abstract-namespace Unix socket (nothing on the filesystem to leave behind) and
//! every peer fetches it with `SCM_RIGHTS`. Peers are checked to run as the same user.

use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};
use nix::sys::socket::{
    self, getsockopt, recvmsg, sendmsg, sockopt, AddressFamily, Backlog, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType, UnixAddr,
};
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Where every PE of the job runs: its host and process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessMap {
    /// Per rank: `(host name, boot id, pid)`.
    pub procs: Vec<(String, String, u32)>,
}

impl ProcessMap {
    /// Collective: learns every PE's host and process.
    pub fn exchange(boot: &dyn Bootstrap) -> Result<ProcessMap> {
        let host = hostname();
        // Two containers may share a host name; the boot id tells machines apart.
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let mine = format!("{host}\n{}\n{}", boot_id.trim(), std::process::id());
        let all = boot.allgather("init/placement", mine.as_bytes())?;
        let procs = all
            .iter()
            .map(|b| {
                let s = String::from_utf8_lossy(b);
                let mut it = s.split('\n');
                let (h, b, p) = (it.next(), it.next(), it.next());
                (
                    h.unwrap_or("").to_string(),
                    b.unwrap_or("").to_string(),
                    p.and_then(|p| p.parse().ok()).unwrap_or(0),
                )
            })
            .collect();
        Ok(ProcessMap { procs })
    }

    /// Whether PEs `a` and `b` are processes of one machine.
    pub fn same_node(&self, a: u32, b: u32) -> bool {
        let (x, y) = (&self.procs[a as usize], &self.procs[b as usize]);
        x.0 == y.0 && x.1 == y.1
    }

    /// Whether PEs `a` and `b` are threads of one process.
    pub fn same_process(&self, a: u32, b: u32) -> bool {
        self.same_node(a, b) && self.procs[a as usize].2 == self.procs[b as usize].2
    }

    /// Whether every PE is a thread of this one process.
    pub fn single_process(&self) -> bool {
        (0..self.procs.len() as u32).all(|j| self.same_process(0, j))
    }
}

/// This machine's host name (empty if it cannot be read).
pub(crate) fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn sock_err(pe: u32, what: &str, e: impl std::fmt::Display) -> Error {
    Error::Rendezvous {
        pe,
        addr: "node-local fd exchange".into(),
        why: format!("{what}: {e}"),
    }
}

fn socket_name(token: u64, rank: u32) -> String {
    format!("ibgda-{token:016x}-{rank}")
}

/// Collective over the whole job: every PE offers `mine` (or nothing), and receives the
/// descriptor of every other PE in `wanted` that runs in another process of this node (`None`
/// elsewhere). `what` names the descriptors in errors.
pub fn exchange_fds(
    boot: &dyn Bootstrap,
    procs: &ProcessMap,
    what: &'static str,
    mine: Option<BorrowedFd<'_>>,
    timeout: Duration,
) -> Result<Vec<Option<OwnedFd>>> {
    let me = boot.rank();
    let n = boot.size();
    // One token per exchange, from rank 0, so two jobs (or two exchanges) never share a name.
    let token_bytes = boot.allgather("init/fd-token", &rand_token().to_le_bytes())?;
    let token = u64::from_le_bytes(token_bytes[0][..8].try_into().expect("8 bytes"));
    let takers: Vec<u32> = (0..n)
        .filter(|&j| j != me && procs.same_node(me, j) && !procs.same_process(me, j))
        .collect();
    let listener = match mine {
        Some(_) if !takers.is_empty() => Some(listen(me, &socket_name(token, me))?),
        _ => None,
    };
    boot.barrier("init/fd-listening")?;
    let (got, fetch_err, served) = std::thread::scope(|s| {
        let server = listener.as_ref().map(|l| {
            let fd = mine.expect("listening only with a descriptor");
            let count = takers.len();
            s.spawn(move || serve(me, l.as_fd(), fd, count, timeout))
        });
        let mut got: Vec<Option<OwnedFd>> = (0..n).map(|_| None).collect();
        let mut fetch_err = None;
        for &j in &takers {
            match fetch(me, j, &socket_name(token, j), timeout) {
                Ok(fd) => got[j as usize] = Some(fd),
                Err(e) => {
                    fetch_err = Some(e);
                    break;
                }
            }
        }
        let served = server.map(|h| h.join()).unwrap_or(Ok(Ok(())));
        (got, fetch_err, served)
    });
    match served {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err(sock_err(me, what, "the fd server thread panicked")),
    }
    if let Some(e) = fetch_err {
        return Err(e);
    }
    boot.barrier("init/fd-done")?;
    tracing::debug!(pe = me, what, peers = takers.len(), "descriptors exchanged");
    Ok(got)
}

fn rand_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish()
}

fn listen(me: u32, name: &str) -> Result<OwnedFd> {
    let fd = socket::socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)
        .map_err(|e| sock_err(me, "socket", e))?;
    let addr = UnixAddr::new_abstract(name.as_bytes()).map_err(|e| sock_err(me, "abstract address", e))?;
    socket::bind(fd.as_raw_fd(), &addr).map_err(|e| sock_err(me, "bind", e))?;
    socket::listen(&fd, Backlog::new(64).expect("valid backlog")).map_err(|e| sock_err(me, "listen", e))?;
    Ok(fd)
}

fn wait_readable(fd: BorrowedFd<'_>, left: Duration) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    let ms = PollTimeout::try_from(left.as_millis().min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX);
    matches!(poll(&mut fds, ms), Ok(n) if n > 0)
}

/// Sends `fd` to `count` peers that connect, checking each runs as our user.
fn serve(me: u32, listener: BorrowedFd<'_>, fd: BorrowedFd<'_>, count: usize, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    for _ in 0..count {
        if !wait_readable(listener, timeout.saturating_sub(start.elapsed())) {
            return Err(sock_err(
                me,
                "serving descriptors",
                format!("a same-node peer did not connect within {} ms", timeout.as_millis()),
            ));
        }
        let raw = socket::accept(listener.as_raw_fd()).map_err(|e| sock_err(me, "accept", e))?;
        // SAFETY: accept returned a fresh descriptor that nothing else owns.
        let conn = unsafe { OwnedFd::from_raw_fd(raw) };
        let cred = getsockopt(&conn, sockopt::PeerCredentials).map_err(|e| sock_err(me, "SO_PEERCRED", e))?;
        if cred.uid() != nix::unistd::getuid().as_raw() {
            return Err(sock_err(
                me,
                "serving descriptors",
                format!("pid {} runs as uid {}, not ours: refused", cred.pid(), cred.uid()),
            ));
        }
        let fds = [fd.as_raw_fd()];
        let cmsg = [ControlMessage::ScmRights(&fds)];
        let who = me.to_le_bytes();
        let iov = [IoSlice::new(&who)];
        sendmsg::<()>(conn.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
            .map_err(|e| sock_err(me, "sendmsg(SCM_RIGHTS)", e))?;
    }
    Ok(())
}

/// Connects to PE `peer`'s socket (retrying until it listens) and receives its descriptor.
fn fetch(me: u32, peer: u32, name: &str, timeout: Duration) -> Result<OwnedFd> {
    let start = Instant::now();
    let addr = UnixAddr::new_abstract(name.as_bytes()).map_err(|e| sock_err(me, "abstract address", e))?;
    let conn = loop {
        let fd = socket::socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)
            .map_err(|e| sock_err(me, "socket", e))?;
        match socket::connect(fd.as_raw_fd(), &addr) {
            Ok(()) => break fd,
            Err(e) if start.elapsed() < timeout => {
                tracing::trace!("fd exchange: PE {peer} not listening yet: {e}");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(sock_err(me, "connect", format!("PE {peer}'s descriptor socket: {e}"))),
        }
    };
    if !wait_readable(conn.as_fd(), timeout.saturating_sub(start.elapsed())) {
        return Err(sock_err(
            me,
            "receiving a descriptor",
            format!("PE {peer} sent nothing within {} ms", timeout.as_millis()),
        ));
    }
    let mut buf = [0u8; 4];
    let mut iov = [IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(conn.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(|e| sock_err(me, "recvmsg(SCM_RIGHTS)", e))?;
    let mut received = None;
    for c in msg.cmsgs().map_err(|e| sock_err(me, "control message", e))? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for f in fds {
                // SAFETY: the kernel installed this descriptor for us; we own it now.
                let owned = unsafe { OwnedFd::from_raw_fd(f) };
                received.get_or_insert(owned);
            }
        }
    }
    let sender = u32::from_le_bytes(buf);
    match received {
        Some(fd) if sender == peer => Ok(fd),
        Some(_) => Err(sock_err(
            me,
            "receiving a descriptor",
            format!("expected PE {peer}'s, got PE {sender}'s"),
        )),
        None => Err(sock_err(
            me,
            "receiving a descriptor",
            format!("PE {peer} sent no descriptor"),
        )),
    }
}
