//! The heap an idle watch's connection holds in the server, counted by allocator: the guard
//! for the size of a connection's futures. An idle HTTP/1.1 watch over TLS once held rustls'
//! connection inline in three nested futures (BENCHMARKS.md, "An idle watch: the TLS
//! handshake and its stream boxed once"); nothing measured it, and it grew unseen. Here the
//! server runs on a runtime of its own whose threads count what they allocate and free, the
//! clients on this thread, which does not count; the watches are opened over real TLS
//! sockets and left idle, and the heap the server's threads hold per watch must stay under
//! the target of 16 KiB.
// Test code: a panic on a broken expectation is the point, and arithmetic on the counts is
// checked by the assertions around it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use rustls::pki_types::ServerName;
use svc_gateway::base::flags::Options;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// The system allocator, counting the live bytes of the threads that ask to be counted.
struct Counting;

/// Bytes allocated minus bytes freed by counted threads.
static LIVE: AtomicI64 = AtomicI64::new(0);

thread_local! {
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn counted() -> bool {
    COUNTED.try_with(Cell::get).unwrap_or(false)
}

fn add(n: usize) {
    LIVE.fetch_add(i64::try_from(n).unwrap_or(i64::MAX), Ordering::Relaxed);
}

fn sub(n: usize) {
    LIVE.fetch_sub(i64::try_from(n).unwrap_or(i64::MAX), Ordering::Relaxed);
}

#[allow(
    unsafe_code,
    reason = "a global allocator is an unsafe trait; this one forwards to System"
)]
// SAFETY: every call is forwarded unchanged to the system allocator; the counting touches
// only an atomic and a const-initialised thread local, neither of which allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() && counted() {
            add(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if counted() {
            sub(layout.size());
        }
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc`, passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() && counted() {
            sub(layout.size());
            add(new_size);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Idle watches opened per measurement.
const WATCHES: usize = 300;

/// The target for an idle HTTP/1.1 watch (the issue's): 16 KiB of server memory.
const TARGET: i64 = 16 * 1024;

/// Opens one HTTP/1.1 watch over TLS and reads its response head; the stream is returned
/// open, the watch idle.
async fn open_watch(
    addr: std::net::SocketAddr,
    tls: TlsConnector,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut s = tls
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    s.write_all(
        b"GET /api/v1/namespaces/default/serviceaccounts?watch=true HTTP/1.1\r\n\
          Host: localhost\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).await.unwrap(), 1, "the head ended early");
        head.extend_from_slice(&byte);
        assert!(head.len() < 8192, "a head that does not end");
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s
}

/// Waits until the ServiceAccounts' watch cache answers (429 while it fills after the start),
/// for at most 60 s.
async fn wait_ready(addr: std::net::SocketAddr, tls: TlsConnector) {
    for _ in 0..600 {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let mut s = tls
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        s.write_all(
            b"GET /api/v1/namespaces/default/serviceaccounts?limit=1 HTTP/1.1\r\n\
              Host: localhost\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer).await;
        if answer.starts_with(b"HTTP/1.1 200") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the server is not ready after 60 s");
}

#[test]
fn an_idle_http1_watch_over_tls_holds_less_than_16_kib_of_the_servers_heap() {
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(|| COUNTED.with(|c| c.set(true)))
        .enable_all()
        .build()
        .unwrap();
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let handle = server_rt
        .block_on(server_rt.spawn(svc_gateway::run::start(Options::for_tests(
            dir.path().to_path_buf(),
        ))))
        .unwrap()
        .unwrap();
    let (cert, key) = handle.pki.admin_credentials();
    let tls = TlsConnector::from(
        handle
            .pki
            .client_config_for(Some((cert, key)), &[b"http/1.1"])
            .unwrap(),
    );
    let addr = handle.addr;
    // The watch caches fill after the start; until then a watch is a 429 (seen on a busy
    // machine).
    client_rt.block_on(wait_ready(addr, tls.clone()));
    // Opens `WATCHES` idle watches, then lets the server settle.
    let open_all = || {
        let open = client_rt.block_on(async {
            let mut v = Vec::new();
            for _ in 0..WATCHES {
                v.push(open_watch(addr, tls.clone()).await);
            }
            v
        });
        std::thread::sleep(Duration::from_millis(500));
        open
    };

    // One round first, so that what the first watch starts once (caches, pools, tables)
    // is not charged to the watches measured; then the same number again, measured.
    let warm = open_all();
    let before = LIVE.load(Ordering::Relaxed);
    let measured = open_all();
    let after = LIVE.load(Ordering::Relaxed);
    let per_watch = (after - before) / WATCHES as i64;
    eprintln!("server heap per idle HTTP/1.1 watch over TLS: {per_watch} bytes");
    assert!(per_watch > 0, "the watches cost nothing? {per_watch}");
    assert!(
        per_watch < TARGET,
        "an idle HTTP/1.1 watch over TLS holds {per_watch} bytes of the server's heap \
         (target: under {TARGET})"
    );
    drop(measured);
    drop(warm);
    server_rt.block_on(handle.shutdown());
}
