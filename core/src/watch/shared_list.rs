//! Whole-list bodies shared by the lists that ask for the same one at once: the same
//! collection (or namespace), with no selector and no limit, at the same revision and in
//! the same media type, is the same bytes. A relist storm asks for exactly that: 2,000
//! informers listing a collection of 1,000 objects built 2,000 bodies of 400 KB from the
//! same items, at a handful of revisions.
//!
//! A body is built once and shared while any response still holds it: the cache keeps only
//! a weak reference, so a body no response is sending any more is freed, and nothing is
//! kept at rest however large the collection. A list after that builds it again.

use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::Mutex;

use svc_storage::Revision;

/// The media types a shared body is kept for, one slot each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListMedia {
    Json,
    Protobuf,
}

/// The last whole-list body of each media type, while a response holds it.
#[derive(Debug, Default)]
pub struct SharedLists {
    slots: [Mutex<Option<Slot>>; 2],
}

#[derive(Debug)]
struct Slot {
    revision: Revision,
    namespace: Option<Box<str>>,
    body: Weak<Vec<u8>>,
}

/// A shared body as the bytes a response sends.
struct Owner(Arc<Vec<u8>>);

impl AsRef<[u8]> for Owner {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

impl SharedLists {
    /// The body of the whole list of `namespace` (all namespaces: `None`) at `revision` in
    /// `media`: the one a response still holds, or `build`'s, kept for the next.
    pub fn get_or_build<E>(
        &self,
        media: ListMedia,
        revision: Revision,
        namespace: Option<&str>,
        build: impl FnOnce() -> Result<Vec<u8>, E>,
    ) -> Result<Bytes, E> {
        let slot = match media {
            ListMedia::Json => &self.slots[0],
            ListMedia::Protobuf => &self.slots[1],
        };
        let held = slot.lock().as_ref().and_then(|s| {
            (s.revision == revision && s.namespace.as_deref() == namespace)
                .then(|| s.body.upgrade())
                .flatten()
        });
        if let Some(body) = held {
            return Ok(Bytes::from_owner(Owner(body)));
        }
        // Built outside the lock: lists of other revisions are not held up by it. Two lists
        // arriving together may both build; the later one's is kept.
        let body = Arc::new(build()?);
        *slot.lock() = Some(Slot {
            revision,
            namespace: namespace.map(Box::from),
            body: Arc::downgrade(&body),
        });
        Ok(Bytes::from_owner(Owner(body)))
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn a_body_is_shared_while_held_and_built_again_after() {
        let lists = SharedLists::default();
        let builds = Cell::new(0);
        let build = |b: &'static [u8]| {
            builds.set(builds.get() + 1);
            Ok::<_, ()>(b.to_vec())
        };
        let a = lists
            .get_or_build(ListMedia::Json, 7, None, || build(b"seven"))
            .unwrap();
        let b = lists
            .get_or_build(ListMedia::Json, 7, None, || build(b"other"))
            .unwrap();
        assert_eq!(
            builds.get(),
            1,
            "the second list at revision 7 shares the first's body"
        );
        assert_eq!(b, Bytes::from_static(b"seven"));
        assert_eq!(a.as_ptr(), b.as_ptr());
        // Another revision, namespace or media type is another body.
        let c = lists
            .get_or_build(ListMedia::Json, 8, None, || build(b"eight"))
            .unwrap();
        let d = lists
            .get_or_build(ListMedia::Json, 8, Some("ns"), || build(b"ns"))
            .unwrap();
        let e = lists
            .get_or_build(ListMedia::Protobuf, 8, Some("ns"), || build(b"pb"))
            .unwrap();
        assert_eq!(builds.get(), 4);
        assert_eq!(
            (&c[..], &d[..], &e[..]),
            (&b"eight"[..], &b"ns"[..], &b"pb"[..])
        );
        // No response holds the namespace's body any more: it is gone, and built again.
        drop(d);
        let f = lists
            .get_or_build(ListMedia::Json, 8, Some("ns"), || build(b"again"))
            .unwrap();
        assert_eq!(&f[..], b"again");
        assert_eq!(builds.get(), 5);
        // A failed build keeps nothing and passes its error on.
        assert_eq!(
            lists.get_or_build(ListMedia::Json, 9, None, || Err::<Vec<u8>, _>("no")),
            Err("no")
        );
        let g = lists
            .get_or_build(ListMedia::Json, 9, None, || build(b"nine"))
            .unwrap();
        assert_eq!(&g[..], b"nine");
        drop((a, b, c, e, f, g));
    }
}
