//! Framing of the agent's unix-socket protocol.
//!
//! A frame is a 12-byte header followed by a payload:
//!
//! ```text
//! magic "FGPU" | version u16 | kind u16 | payload length u32 | payload
//! ```
//!
//! all little-endian. Decoding never panics on any input: short input asks for more bytes,
//! bad input is an error naming what was wrong.

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub const MAGIC: [u8; 4] = *b"FGPU";
/// The protocol version this build speaks.
pub const VERSION: u16 = 1;
pub const HEADER_LEN: usize = 12;
/// Frames larger than this are refused (a status of thousands of cgroups fits easily).
pub const MAX_PAYLOAD: usize = 16 << 20;

/// What a frame asks or answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Kind {
    /// CLI → agent: report usage per cgroup. Empty payload.
    StatusRequest = 1,
    /// CLI → agent: set (merge) a cgroup's limit. JSON `{target, limit}`.
    LimitSet = 2,
    /// CLI → agent: a cgroup's own and effective limit. JSON `{target}`.
    LimitGet = 3,
    /// CLI → agent: every explicitly set limit. Empty payload.
    LimitList = 4,
    /// CLI → agent: remove a cgroup's own limit. JSON `{target}`.
    LimitRemove = 5,
    /// Shim → agent: "I am starting"; the agent identifies the peer by SO_PEERCRED.
    Hello = 16,
    /// Agent → CLI: the status, a JSON array (see `fgpu status --json`).
    StatusReply = 0x8001,
    /// Agent → CLI: one limit entry, or an array of them (JSON).
    LimitReply = 0x8002,
    /// Agent → shim: the ledger of the shim's cgroup; file descriptors ride along
    /// (SCM_RIGHTS). Payload: the cgroup path (UTF-8).
    LedgerReply = 0x8010,
    /// Agent → any: the request failed; payload is a UTF-8 message for people.
    Error = 0xffff,
}

impl Kind {
    fn from_raw(raw: u16) -> Option<Self> {
        match raw {
            1 => Some(Self::StatusRequest),
            2 => Some(Self::LimitSet),
            3 => Some(Self::LimitGet),
            4 => Some(Self::LimitList),
            5 => Some(Self::LimitRemove),
            16 => Some(Self::Hello),
            0x8001 => Some(Self::StatusReply),
            0x8002 => Some(Self::LimitReply),
            0x8010 => Some(Self::LedgerReply),
            0xffff => Some(Self::Error),
            _ => None,
        }
    }
}

/// The shim's side of the protocol: `Hello` and `LedgerReply` carry small binary payloads
/// (the shim has no JSON), and file descriptors ride along with SCM_RIGHTS.
///
/// ```text
/// shim  → agent  Hello        payload: HelloPayload (8 bytes)
///                             fds: none, or [usage] when the shim already holds a ledger
///                             (a reconnect after the agent restarted)
/// agent → shim   LedgerReply  payload: LedgerPayload (8 bytes + cgroup path, UTF-8)
///                             fds: [limits, usage]
/// agent → shim   Error        payload: message (the shim then runs standalone)
/// ```
///
/// `limits` is a memfd of exactly [`crate::ledger::PAGE`] bytes holding the ledger's
/// `Limits` page, sealed with `F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE |
/// F_SEAL_SEAL`: the shim can only map it `PROT_READ` (no process in the container can raise
/// its limit, even by writing memory), while the agent keeps writing it through the mapping
/// it made before sealing. `usage` is a memfd of `LEDGER_SIZE - PAGE` bytes holding the
/// `Usage` page and the slots, shared read-write. The shim maps the two contiguously
/// (limits at offset 0, usage at `PAGE`) so that they form one `Ledger`.
///
/// OFD locks (each process's liveness lock on its slot) belong to open file descriptions,
/// and every shim of a cgroup receives the same description: a shim must reopen the usage
/// memfd it receives (`/proc/self/fd/N`) before locking its slot, and the usage fd it sends
/// on a reconnect must be a fresh description nobody locks through (the agent tests slot
/// locks through it to reclaim dead processes' shares).
///
/// On a reconnect the shim sends the usage memfd it holds; an agent with no ledger for that
/// cgroup yet adopts it (so usage survives an agent restart) and answers with a new limits
/// memfd and that same usage memfd. If the agent already has another usage memfd for the
/// cgroup, it answers with its own, and the shim moves its charges over.
pub mod shim {
    /// Version of the shim payloads.
    pub const VERSION: u32 = 1;
    /// `HelloPayload::flags`: an fd with the shim's current usage memfd is attached.
    pub const HELLO_HAS_USAGE_FD: u32 = 1;

    /// `Hello`'s payload.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct HelloPayload {
        pub version: u32,
        pub flags: u32,
    }

    impl HelloPayload {
        pub fn encode(&self) -> [u8; 8] {
            let mut b = [0u8; 8];
            b[..4].copy_from_slice(&self.version.to_le_bytes());
            b[4..].copy_from_slice(&self.flags.to_le_bytes());
            b
        }

        pub fn decode(b: &[u8]) -> Option<Self> {
            Some(Self {
                version: u32::from_le_bytes(b.get(..4)?.try_into().ok()?),
                flags: u32::from_le_bytes(b.get(4..8)?.try_into().ok()?),
            })
        }
    }

    /// `LedgerReply`'s payload: version, then the cgroup path the ledger belongs to.
    pub fn encode_ledger_reply(cgroup: &str) -> Vec<u8> {
        let mut b = Vec::with_capacity(8 + cgroup.len());
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(cgroup.as_bytes());
        b
    }

    /// Returns (version, cgroup path).
    pub fn decode_ledger_reply(b: &[u8]) -> Option<(u32, &str)> {
        let version = u32::from_le_bytes(b.get(..4)?.try_into().ok()?);
        let path = std::str::from_utf8(b.get(8..)?).ok()?;
        Some((version, path))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: Kind,
    pub payload: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("not an fgpu frame (bad magic): is this the fgpu socket?")]
    BadMagic,
    #[error(
        "protocol version {0} is not supported (this build speaks {VERSION}): upgrade the older side"
    )]
    Version(u16),
    #[error("unknown frame kind {0:#x}")]
    UnknownKind(u16),
    #[error("frame of {len} bytes exceeds the {max}-byte limit of this socket")]
    TooLarge { len: usize, max: usize },
}

impl Frame {
    pub fn new(kind: Kind, payload: impl Into<Bytes>) -> Self {
        Self {
            kind,
            payload: payload.into(),
        }
    }

    /// Appends the encoded frame to `out`.
    pub fn encode(&self, out: &mut BytesMut) -> Result<(), ProtoError> {
        if self.payload.len() > MAX_PAYLOAD {
            return Err(ProtoError::TooLarge {
                len: self.payload.len(),
                max: MAX_PAYLOAD,
            });
        }
        out.reserve(HEADER_LEN + self.payload.len());
        out.put_slice(&MAGIC);
        out.put_u16_le(VERSION);
        out.put_u16_le(self.kind as u16);
        out.put_u32_le(self.payload.len() as u32);
        out.put_slice(&self.payload);
        Ok(())
    }

    /// Takes one frame off the front of `buf`; `Ok(None)` when more bytes are needed.
    pub fn decode(buf: &mut BytesMut) -> Result<Option<Self>, ProtoError> {
        Self::decode_max(buf, MAX_PAYLOAD)
    }

    /// [`Frame::decode`] with a smaller payload limit (a server's per-socket cap). A header
    /// announcing more than `max` bytes is refused as soon as the header is complete, before
    /// any of the payload is waited for or buffered.
    pub fn decode_max(buf: &mut BytesMut, max: usize) -> Result<Option<Self>, ProtoError> {
        let max = max.min(MAX_PAYLOAD);
        if buf.len() < HEADER_LEN {
            // Reject garbage early, before waiting for a full header.
            let n = buf.len().min(4);
            if buf[..n] != MAGIC[..n] {
                return Err(ProtoError::BadMagic);
            }
            return Ok(None);
        }
        if buf[..4] != MAGIC {
            return Err(ProtoError::BadMagic);
        }
        let version = u16::from_le_bytes([buf[4], buf[5]]);
        if version != VERSION {
            return Err(ProtoError::Version(version));
        }
        let raw_kind = u16::from_le_bytes([buf[6], buf[7]]);
        let len = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize;
        if len > max {
            return Err(ProtoError::TooLarge { len, max });
        }
        let kind = Kind::from_raw(raw_kind).ok_or(ProtoError::UnknownKind(raw_kind))?;
        if buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        buf.advance(HEADER_LEN);
        let payload = buf.split_to(len).freeze();
        Ok(Some(Self { kind, payload }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_in_pieces() {
        let mut wire = BytesMut::new();
        Frame::new(Kind::StatusReply, &b"[{\"cgroup\":\"/a\"}]"[..])
            .encode(&mut wire)
            .unwrap();
        Frame::new(Kind::StatusRequest, Bytes::new())
            .encode(&mut wire)
            .unwrap();
        let all = wire.freeze();
        // Feed one byte at a time: every prefix is either "need more" or a whole frame.
        let mut buf = BytesMut::new();
        let mut frames = Vec::new();
        for b in all.iter() {
            buf.put_u8(*b);
            while let Some(f) = Frame::decode(&mut buf).unwrap() {
                frames.push(f);
            }
        }
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].kind, Kind::StatusReply);
        assert_eq!(&frames[0].payload[..], b"[{\"cgroup\":\"/a\"}]");
        assert_eq!(frames[1].kind, Kind::StatusRequest);
        assert!(buf.is_empty());
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let mut b = BytesMut::from(&b"GET / HTTP/1.1\r\n"[..]);
        assert_eq!(Frame::decode(&mut b), Err(ProtoError::BadMagic));
        let mut b = BytesMut::from(&b"FG"[..]);
        assert_eq!(Frame::decode(&mut b), Ok(None));
        let mut b = BytesMut::from(&b"FGPU\x09\x00\x01\x00\x00\x00\x00\x00"[..]);
        assert_eq!(Frame::decode(&mut b), Err(ProtoError::Version(9)));
        let mut b = BytesMut::from(&b"FGPU\x01\x00\x07\x00\x00\x00\x00\x00"[..]);
        assert_eq!(Frame::decode(&mut b), Err(ProtoError::UnknownKind(7)));
        for kind in [
            Kind::LimitSet,
            Kind::Hello,
            Kind::LedgerReply,
            Kind::LimitReply,
        ] {
            let mut wire = BytesMut::new();
            Frame::new(kind, Bytes::new()).encode(&mut wire).unwrap();
            assert_eq!(Frame::decode(&mut wire).unwrap().unwrap().kind, kind);
        }
        let mut b = BytesMut::from(&b"FGPU\x01\x00\x01\x00\xff\xff\xff\xff"[..]);
        assert!(matches!(
            Frame::decode(&mut b),
            Err(ProtoError::TooLarge { .. })
        ));
        // A 64 MiB header on a socket capped at 4 KiB: refused from the header alone.
        let mut b = BytesMut::from(&b"FGPU\x01\x00\x10\x00\x00\x00\x00\x04"[..]);
        assert_eq!(
            Frame::decode_max(&mut b, 4096),
            Err(ProtoError::TooLarge {
                len: 64 << 20,
                max: 4096
            })
        );
        assert_eq!(
            ProtoError::TooLarge {
                len: 64 << 20,
                max: 4096
            }
            .to_string(),
            "frame of 67108864 bytes exceeds the 4096-byte limit of this socket"
        );
        // A frame that fits the cap decodes.
        let mut wire = BytesMut::new();
        Frame::new(Kind::Hello, vec![0u8; 8])
            .encode(&mut wire)
            .unwrap();
        assert!(Frame::decode_max(&mut wire, 8).unwrap().is_some());
    }

    #[test]
    fn shim_payloads_round_trip() {
        let h = shim::HelloPayload {
            version: shim::VERSION,
            flags: shim::HELLO_HAS_USAGE_FD,
        };
        assert_eq!(shim::HelloPayload::decode(&h.encode()), Some(h));
        assert_eq!(shim::HelloPayload::decode(&[1, 0, 0]), None);
        let r = shim::encode_ledger_reply("/kubepods.slice/x");
        assert_eq!(
            shim::decode_ledger_reply(&r),
            Some((shim::VERSION, "/kubepods.slice/x"))
        );
        assert_eq!(shim::decode_ledger_reply(&r[..5]), None);
    }

    #[test]
    fn pseudo_random_bytes_never_panic() {
        // A small deterministic generator: decoding arbitrary input must only ever return.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            let mut buf = BytesMut::new();
            let len = (x % 40) as usize;
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                buf.put_u8(x as u8);
            }
            if x.is_multiple_of(3) && buf.len() >= 4 {
                buf[..4].copy_from_slice(&MAGIC);
            }
            let _ = Frame::decode(&mut buf);
        }
    }
}
