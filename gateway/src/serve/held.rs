//! [`Held`]: a response body passed on unchanged while it keeps something held until it is
//! dropped (a connection's in-flight count, a watch's place, an audit record waiting for
//! `ResponseComplete`) and, given a stop signal, ends once the signal is set (the server
//! ending its watches at shutdown). One wrapper for every streamed answer whose end the
//! server must see.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::{Body, Frame, SizeHint};

/// A signal that ends a body: ready once set.
pub type Stop = Pin<Box<dyn Future<Output = ()> + Send + Sync>>;

/// `inner`, holding `held` until dropped, and ended by `stop` once it is ready.
pub struct Held<B, H> {
    inner: B,
    stop: Option<Stop>,
    _held: H,
}

impl<B, H> Held<B, H> {
    /// `inner` holding `held` until it is dropped.
    pub fn new(inner: B, held: H) -> Self {
        Held {
            inner,
            stop: None,
            _held: held,
        }
    }

    /// The same, ended when `stop` is ready.
    pub fn until(inner: B, held: H, stop: Stop) -> Self {
        Held {
            inner,
            stop: Some(stop),
            _held: held,
        }
    }
}

impl<B: Body + Unpin, H: Unpin> Body for Held<B, H> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if let Some(stop) = self.stop.as_mut()
            && stop.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(None);
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use bytes::Bytes;
    use http_body_util::{BodyExt as _, StreamBody};

    use super::*;

    /// Sets its flag when dropped.
    struct Flag(Arc<AtomicBool>);

    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn endless() -> impl Body<Data = Bytes, Error = std::io::Error> + Unpin {
        StreamBody::new(futures::stream::repeat_with(|| {
            Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(b"x")))
        }))
    }

    #[tokio::test]
    async fn passes_frames_on_and_lets_go_when_dropped() {
        let dropped = Arc::new(AtomicBool::new(false));
        let mut body = Held::new(
            http_body_util::Full::new(Bytes::from_static(b"whole")),
            Flag(dropped.clone()),
        );
        assert_eq!(body.size_hint().exact(), Some(5));
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"whole"));
        assert!(body.frame().await.is_none());
        assert!(!dropped.load(Ordering::SeqCst), "held while the body lives");
        drop(body);
        assert!(dropped.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn ends_once_stopped() {
        let (tx, mut rx) = tokio::sync::watch::channel(false);
        let stop: Stop = Box::pin(async move {
            let _ = rx.wait_for(|stopped| *stopped).await;
        });
        let mut body = Held::until(endless(), (), stop);
        for _ in 0..3 {
            assert!(body.frame().await.is_some(), "frames before the stop");
        }
        tx.send(true).unwrap();
        assert!(body.frame().await.is_none(), "ended at the stop");
    }
}
