//! Decoding a control request's payload (everything a peer sends besides Hello, whose payload
//! is `fgpu_common::proto::shim::HelloPayload`). Pure: no I/O, no state, never panics; the
//! fuzz targets in `fuzz/` call it on arbitrary bytes.

use fgpu_common::proto::{Frame, Kind};

use crate::api::{LimitSetRequest, TargetRequest};

/// Longest TARGET accepted (a cgroup path; Linux paths are at most 4096 bytes).
pub const MAX_TARGET: usize = 4096;

/// A control request, decoded.
#[derive(Debug, Clone)]
pub enum Request {
    Status,
    LimitSet(Box<LimitSetRequest>),
    LimitGet(TargetRequest),
    LimitList,
    LimitRemove(TargetRequest),
}

impl Request {
    /// What it is called in messages and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Status => "status",
            Request::LimitSet(_) => "limit set",
            Request::LimitGet(_) => "limit get",
            Request::LimitList => "limit ls",
            Request::LimitRemove(_) => "limit rm",
        }
    }

    /// Whether it changes the agent's state.
    pub fn changes_state(&self) -> bool {
        matches!(self, Request::LimitSet(_) | Request::LimitRemove(_))
    }
}

/// Decodes the request in `frame`; the error is a message for people.
pub fn decode(frame: &Frame) -> Result<Request, String> {
    decode_parts(frame.kind, &frame.payload)
}

/// [`decode`] on a kind and a payload.
pub fn decode_parts(kind: Kind, payload: &[u8]) -> Result<Request, String> {
    match kind {
        Kind::StatusRequest => Ok(Request::Status),
        Kind::LimitList => Ok(Request::LimitList),
        Kind::LimitSet => {
            let req: LimitSetRequest = json(payload)?;
            target(&req.target)?;
            Ok(Request::LimitSet(Box::new(req)))
        }
        Kind::LimitGet => Ok(Request::LimitGet(target_request(payload)?)),
        Kind::LimitRemove => Ok(Request::LimitRemove(target_request(payload)?)),
        other => Err(format!("unexpected request {other:?}")),
    }
}

fn json<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, String> {
    serde_json::from_slice(payload).map_err(|e| format!("malformed limit request: {e}"))
}

fn target_request(payload: &[u8]) -> Result<TargetRequest, String> {
    let req: TargetRequest = json(payload)?;
    target(&req.target)?;
    Ok(req)
}

fn target(t: &str) -> Result<(), String> {
    if t.len() > MAX_TARGET {
        return Err(format!(
            "TARGET of {} bytes is too long (at most {MAX_TARGET})",
            t.len()
        ));
    }
    if t.contains('\0') {
        return Err("TARGET contains a NUL byte".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_decode_and_bad_ones_say_why() {
        let ok = decode_parts(
            Kind::LimitSet,
            br#"{"target":"/a","limit":{"memory_bytes":5,"compute_pct":null,"compute_cap_pct":null}}"#,
        )
        .unwrap();
        assert!(ok.changes_state());
        assert_eq!(ok.name(), "limit set");
        assert!(matches!(
            decode_parts(Kind::LimitGet, br#"{"target":"/a"}"#),
            Ok(Request::LimitGet(_))
        ));
        assert!(
            decode_parts(Kind::LimitRemove, b"{")
                .unwrap_err()
                .starts_with("malformed limit request")
        );
        assert!(
            decode_parts(
                Kind::LimitSet,
                br#"{"target":"/a","limit":{"compute_pct":300}}"#
            )
            .is_err()
        );
        let long = format!(r#"{{"target":"{}"}}"#, "a".repeat(MAX_TARGET + 1));
        assert!(
            decode_parts(Kind::LimitGet, long.as_bytes())
                .unwrap_err()
                .contains("too long")
        );
        assert!(
            decode_parts(Kind::LimitGet, br#"{"target":"/a\u0000b"}"#)
                .unwrap_err()
                .contains("NUL")
        );
        assert_eq!(
            decode_parts(Kind::LedgerReply, b"").unwrap_err(),
            "unexpected request LedgerReply"
        );
        assert!(matches!(
            decode_parts(Kind::StatusRequest, b"ignored"),
            Ok(Request::Status)
        ));
    }
}
