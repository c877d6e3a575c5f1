//! A TCP fault proxy on loopback: sits between nodes and the hub (TLS passes through untouched)
//! and, on command, blackholes, resets, cuts after N bytes or delays each chunk.
//!
//! One `Proxy` is one link (one listening port, one upstream). A fault applies to new
//! connections and to the ones already open: `Reset` closes them at once (with an RST),
//! `Blackhole` makes them swallow everything from then on, `CutAfter` closes each after it has
//! carried N more bytes, `Delay` sleeps before forwarding every chunk. `Pass` heals: new
//! connections go through; blackholed ones stay dead until their peer gives up (a TLS stream
//! that lost bytes cannot be resumed anyway), or until `close_open` resets them. The upstream can be moved (a restarted hub listens
//! on a new port) without the clients noticing anything but closed connections.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long the proxy waits to connect upstream before dropping the client.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes read per chunk.
const CHUNK_BYTES: usize = 16 * 1024;

/// What the link does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything (healed).
    Pass,
    /// Accept and read, never forward; open connections go silent.
    Blackhole,
    /// Close every connection at once, new ones as soon as they are accepted.
    Reset,
    /// Close each connection after it has carried this many more bytes (both directions).
    CutAfter(u64),
    /// Sleep this long before forwarding each chunk.
    Delay(Duration),
}

impl Fault {
    /// Parses the command form: `pass`, `blackhole`, `reset`, `cut N`, `delay MS`.
    pub fn parse(text: &str) -> Option<Fault> {
        let mut words = text.split_whitespace();
        let f = match (words.next()?, words.next()) {
            ("pass" | "heal", None) => Fault::Pass,
            ("blackhole", None) => Fault::Blackhole,
            ("reset", None) => Fault::Reset,
            ("cut", Some(n)) => Fault::CutAfter(n.parse().ok()?),
            ("delay", Some(ms)) => Fault::Delay(Duration::from_millis(ms.parse().ok()?)),
            _ => return None,
        };
        words.next().is_none().then_some(f)
    }
}

/// Counters of one link.
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Bytes forwarded (both directions).
    pub forwarded_bytes: AtomicU64,
    /// Bytes swallowed by a blackhole.
    pub dropped_bytes: AtomicU64,
    /// Connections closed by a reset or a cut.
    pub cut: AtomicU64,
}

struct Shared {
    fault: watch::Sender<Fault>,
    /// Bumped by `close_open`: every connection open then is reset.
    closing: watch::Sender<u64>,
    upstream: Mutex<SocketAddr>,
    stats: Stats,
}

/// One proxied link. Dropping it stops the listener and resets every open connection.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy").field("addr", &self.addr).field("fault", &self.fault()).finish()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.shared.fault.send_replace(Fault::Reset);
    }
}

impl Proxy {
    /// Listens on `listen` (use port 0 for a free one) and forwards to `upstream`. Must be
    /// called inside a tokio runtime; the proxy's tasks live on it.
    pub async fn start(listen: SocketAddr, upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let (tx, _) = watch::channel(Fault::Pass);
        let (closing, _) = watch::channel(0);
        let shared = Arc::new(Shared { fault: tx, closing, upstream: Mutex::new(upstream), stats: Stats::default() });
        let task = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(Proxy { addr, shared, task })
    }

    /// The address clients dial.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Applies a fault to new and open connections.
    pub fn set(&self, fault: Fault) {
        self.shared.fault.send_replace(fault);
    }

    /// Heals the link (`Fault::Pass`).
    pub fn heal(&self) {
        self.set(Fault::Pass);
    }

    /// Resets (RST) every connection open now, whatever it carries, as a peer does that gives up
    /// on a connection it lost bytes on: after a heal, the clients' next requests then open new
    /// connections that pass, instead of waiting out their timeouts on blackholed ones. New
    /// connections get the fault in force.
    pub fn close_open(&self) {
        self.shared.closing.send_modify(|n| *n += 1);
    }

    /// The fault now in force.
    pub fn fault(&self) -> Fault {
        *self.shared.fault.borrow()
    }

    /// Points the link at a new upstream (new connections only).
    pub fn set_upstream(&self, upstream: SocketAddr) {
        if let Ok(mut u) = self.shared.upstream.lock() {
            *u = upstream;
        }
    }

    /// The link's counters.
    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        shared.stats.accepted.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(connection(client, Arc::clone(&shared)));
    }
}

/// Closes `s` with an RST rather than a FIN.
fn rst(s: TcpStream) {
    let _ = socket_zero_linger(&s);
    drop(s);
}

#[allow(deprecated)] // set_linger is the only way tokio offers to ask for an RST.
fn socket_zero_linger(s: &TcpStream) -> std::io::Result<()> {
    s.set_linger(Some(Duration::ZERO))
}

async fn connection(client: TcpStream, shared: Arc<Shared>) {
    let mut rx = shared.fault.subscribe();
    let closing = shared.closing.subscribe();
    let fault = *rx.borrow_and_update();
    match fault {
        Fault::Reset => {
            shared.stats.cut.fetch_add(1, Ordering::Relaxed);
            return rst(client);
        }
        Fault::Blackhole => return swallow(client, &shared, rx, closing).await,
        _ => {}
    }
    let upstream = shared.upstream.lock().map(|u| *u).ok();
    let Some(upstream) = upstream else { return };
    let server = match tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(upstream)).await {
        Ok(Ok(s)) => s,
        _ => return rst(client),
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    pump(client, server, &shared, rx, closing).await;
}

/// Reads and discards until the peer closes or the link resets.
async fn swallow(
    mut client: TcpStream,
    shared: &Shared,
    mut rx: watch::Receiver<Fault>,
    mut closing: watch::Receiver<u64>,
) {
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        tokio::select! {
            r = client.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => { shared.stats.dropped_bytes.fetch_add(n as u64, Ordering::Relaxed); }
            },
            c = rx.changed() => {
                if c.is_err() || *rx.borrow_and_update() == Fault::Reset {
                    shared.stats.cut.fetch_add(1, Ordering::Relaxed);
                    return rst(client);
                }
            }
            _ = closing.changed() => {
                shared.stats.cut.fetch_add(1, Ordering::Relaxed);
                return rst(client);
            }
        }
    }
}

/// Forwards both ways, applying the fault in force to each chunk.
async fn pump(
    client: TcpStream,
    server: TcpStream,
    shared: &Shared,
    mut rx: watch::Receiver<Fault>,
    mut closing: watch::Receiver<u64>,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let mut cbuf = vec![0u8; CHUNK_BYTES];
    let mut sbuf = vec![0u8; CHUNK_BYTES];
    let mut blackholed = false;
    let mut cut = false;
    // Bytes this connection may still carry under a CutAfter, counted from when it was set.
    let initial = *rx.borrow();
    let mut budget: Option<u64> = match initial {
        Fault::CutAfter(n) => Some(n),
        _ => None,
    };
    loop {
        let (data, to_server) = tokio::select! {
            r = cr.read(&mut cbuf) => match r { Ok(0) | Err(_) => break, Ok(n) => (&cbuf[..n], true) },
            r = sr.read(&mut sbuf) => match r { Ok(0) | Err(_) => break, Ok(n) => (&sbuf[..n], false) },
            c = rx.changed() => {
                if c.is_err() { break; }
                let changed = *rx.borrow_and_update();
                match changed {
                    Fault::Reset => { shared.stats.cut.fetch_add(1, Ordering::Relaxed); cut = true; break; }
                    Fault::Blackhole => blackholed = true,
                    Fault::CutAfter(n) => budget = Some(n),
                    Fault::Pass | Fault::Delay(_) => budget = None,
                }
                continue;
            }
            _ = closing.changed() => { shared.stats.cut.fetch_add(1, Ordering::Relaxed); cut = true; break; }
        };
        if blackholed {
            shared.stats.dropped_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
            continue;
        }
        let now = *rx.borrow();
        if let Fault::Delay(d) = now {
            tokio::time::sleep(d).await;
        }
        let (chunk, last) = match budget {
            Some(b) if (data.len() as u64) >= b => (&data[..b as usize], true),
            Some(b) => {
                budget = Some(b - data.len() as u64);
                (data, false)
            }
            None => (data, false),
        };
        let w = if to_server { sw.write_all(chunk).await } else { cw.write_all(chunk).await };
        shared.stats.forwarded_bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        if w.is_err() {
            break;
        }
        if last {
            shared.stats.cut.fetch_add(1, Ordering::Relaxed);
            cut = true;
            break;
        }
    }
    if cut {
        // A cut is abrupt: an RST so both peers notice at once.
        if let (Ok(c), Ok(s)) = (cr.reunite(cw), sr.reunite(sw)) {
            rst(c);
            rst(s);
        }
    } else {
        // One side closed: pass the close on gracefully so no delivered byte is lost.
        let _ = cw.shutdown().await;
        let _ = sw.shutdown().await;
    }
}
