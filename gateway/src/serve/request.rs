//! What a request is before the pipeline reads it: who sent it ([`Caller`]) and its body,
//! still arriving from the client or already in memory ([`RequestBody`]).

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use svc_core::user::UserInfo;

use crate::outbound::client::{self, BoxError};
use crate::security::authn::ConnIdentity;

/// Who sent a request, before authentication has looked at it.
pub enum Caller {
    /// A client on a connection (its certificate, if any, already verified by TLS).
    Connection(Arc<ConnIdentity>),
    /// The server itself (a controller), acting as this user; authorization still applies.
    Internal(UserInfo),
}

/// A request body: still arriving from a client, or already in memory.
pub enum RequestBody {
    Stream(Incoming),
    /// A request on an h2 connection served by `h2conn.rs`.
    H2(H2Body),
    Full(Bytes),
}

/// An h2 request body: gives flow-control capacity back as it is read, so the client may
/// send more (the pipeline bounds what it reads; proxy mode streams it on).
pub struct H2Body {
    recv: h2::RecvStream,
    /// The `content-length` the client declared (0 when absent).
    declared: u64,
}

impl H2Body {
    pub fn new(recv: h2::RecvStream, declared: Option<u64>) -> Self {
        H2Body {
            recv,
            declared: declared.unwrap_or(0),
        }
    }
}

impl hyper::body::Body for H2Body {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, h2::Error>>> {
        match self.recv.poll_data(cx) {
            std::task::Poll::Ready(Some(Ok(data))) => {
                let _ = self.recv.flow_control().release_capacity(data.len());
                std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(data))))
            }
            other => other.map(|d| d.map(|r| r.map(hyper::body::Frame::data))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        let mut hint = hyper::body::SizeHint::new();
        hint.set_lower(self.declared);
        hint
    }
}

impl RequestBody {
    /// The body as the upstream client sends it (proxy mode): streamed as it arrives.
    pub fn into_outbound(self) -> client::RequestBody {
        match self {
            RequestBody::Stream(b) => b.map_err(|e| Box::new(e) as BoxError).boxed_unsync(),
            RequestBody::H2(b) => b.map_err(|e| Box::new(e) as BoxError).boxed_unsync(),
            RequestBody::Full(b) => client::buffered(b),
        }
    }
}
