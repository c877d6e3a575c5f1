//! The fault proxy against a local echo server: pass, blackhole, reset, cut after N bytes,
//! delay, and moving the upstream.

use baton_fault::proxy::{Fault, Proxy};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Long enough for any answer that should come, however loaded the machine: only a broken
/// proxy makes a test wait this long.
const ANSWER_WAIT: Duration = Duration::from_secs(20);
/// How long a blackholed link is watched for an answer that must not come.
const SILENCE: Duration = Duration::from_millis(500);

async fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// Sends `msg` and reads up to its length back, within `limit`. Returns what came back.
async fn roundtrip(addr: SocketAddr, msg: &[u8], limit: Duration) -> Result<Vec<u8>, String> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    s.write_all(msg).await.map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(limit, async {
        while got.len() < msg.len() {
            match s.read(&mut buf).await {
                Ok(0) => return Err("closed".to_string()),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(())
    })
    .await;
    match read {
        Err(_) => Err(format!("timeout after {} bytes", got.len())),
        Ok(Err(e)) => Err(format!("{e} after {} bytes", got.len())),
        Ok(Ok(())) => Ok(got),
    }
}

#[tokio::test]
async fn pass_blackhole_reset_cut_delay_and_heal() {
    let echo = echo_server().await;
    let p = Proxy::start(([127, 0, 0, 1], 0).into(), echo).await.unwrap();
    assert_eq!(roundtrip(p.addr(), b"hello", ANSWER_WAIT).await.unwrap(), b"hello");

    p.set(Fault::Blackhole);
    let e = roundtrip(p.addr(), b"hello", SILENCE).await.unwrap_err();
    assert!(e.starts_with("timeout after 0"), "{e}");

    p.set(Fault::Reset);
    let e = roundtrip(p.addr(), b"hello", ANSWER_WAIT).await.unwrap_err();
    assert!(!e.starts_with("timeout"), "a reset closes at once: {e}");

    p.set(Fault::CutAfter(3));
    let e = roundtrip(p.addr(), b"hello", ANSWER_WAIT).await.unwrap_err();
    assert!(!e.starts_with("timeout") && !e.contains("after 5"), "{e}");

    p.set(Fault::Delay(Duration::from_millis(150)));
    let t = Instant::now();
    assert_eq!(roundtrip(p.addr(), b"hello", ANSWER_WAIT).await.unwrap(), b"hello");
    assert!(t.elapsed() >= Duration::from_millis(300), "two delayed chunks: {:?}", t.elapsed());

    p.heal();
    assert_eq!(roundtrip(p.addr(), b"healed", ANSWER_WAIT).await.unwrap(), b"healed");
    assert!(p.stats().cut.load(std::sync::atomic::Ordering::Relaxed) >= 2);
}

#[tokio::test]
async fn a_reset_closes_open_connections_and_the_upstream_can_move() {
    let echo = echo_server().await;
    let p = Proxy::start(([127, 0, 0, 1], 0).into(), ([127, 0, 0, 1], 9).into()).await.unwrap();
    // The upstream is unreachable: the client is dropped.
    assert!(roundtrip(p.addr(), b"x", ANSWER_WAIT).await.is_err());
    p.set_upstream(echo);
    let mut s = TcpStream::connect(p.addr()).await.unwrap();
    s.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).await.unwrap();
    p.set(Fault::Reset);
    let r = tokio::time::timeout(ANSWER_WAIT, s.read(&mut buf)).await.unwrap();
    assert!(matches!(r, Ok(0) | Err(_)), "the open connection was closed: {r:?}");
}

#[tokio::test]
async fn links_cut_one_by_one_heal_in_any_order() {
    let echo = echo_server().await;
    let mut links = Vec::new();
    for _ in 0..3 {
        links.push(Proxy::start(([127, 0, 0, 1], 0).into(), echo).await.unwrap());
    }
    for (i, l) in links.iter().enumerate() {
        l.set(Fault::Blackhole);
        for (j, other) in links.iter().enumerate() {
            // A passing link gets all the time it needs; a cut one is only watched for silence.
            let limit = if j > i { ANSWER_WAIT } else { SILENCE };
            let ok = roundtrip(other.addr(), b"x", limit).await.is_ok();
            assert_eq!(ok, j > i, "link {j} after cutting {i}");
        }
    }
    for i in [2usize, 0, 1] {
        links[i].heal();
        assert!(roundtrip(links[i].addr(), b"y", ANSWER_WAIT).await.is_ok());
    }
}

#[test]
fn fault_commands_parse() {
    assert_eq!(Fault::parse("cut 10"), Some(Fault::CutAfter(10)));
    assert_eq!(Fault::parse("delay 5"), Some(Fault::Delay(Duration::from_millis(5))));
    assert_eq!(Fault::parse("pass"), Some(Fault::Pass));
    assert_eq!(Fault::parse("cut"), None);
    assert_eq!(Fault::parse("reset now"), None);
}
