//! The request head's bounds, and the 431 hyper answers a head over them with, rewritten into
//! the `{code, message}` body every error of the API has.

use std::pin::Pin;
use std::task::{Context as TaskContext, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Most header fields in a request head (hyper's own bound, kept: a larger one costs every
/// request a heap allocation); more are answered 431 `headers_too_large`.
pub const HEADER_FIELDS_MAX: usize = 100;
/// Most bytes of a request head, the request line included (HTTP/1: hyper's read buffer, which
/// a head must fit in whole), or of its header list (HTTP/2, announced in SETTINGS); more are
/// answered 431 `headers_too_large`.
pub const HEADER_BYTES_MAX: usize = 64 * 1024;

/// The text hyper answers a request head over its bounds with: a 431 head and no body.
const HYPER_431: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\n";

/// A connection's stream that gives hyper's own 431 answer (a head over `HEADER_FIELDS_MAX` or
/// `HEADER_BYTES_MAX`, answered before any service sees the request) the `{code, message}` body
/// every other error has. Everything else passes through unchanged. It reports no vectored
/// writes, so hyper writes each answer's head whole into one buffer, where it is found.
pub(super) struct Answer431<T> {
    inner: T,
    /// The rewritten answer still to be written, and how much of it has been.
    pending: Option<(Vec<u8>, usize)>,
}

impl<T> Answer431<T> {
    /// Wraps a connection's stream.
    pub(super) fn new(inner: T) -> Self {
        Answer431 { inner, pending: None }
    }
}

impl<T: AsyncWrite + Unpin> Answer431<T> {
    /// Writes what is pending of a rewritten answer.
    fn drain(&mut self, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        while let Some((bytes, at)) = &mut self.pending {
            if *at == bytes.len() {
                self.pending = None;
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*at..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            *at += n;
        }
        Poll::Ready(Ok(()))
    }
}

/// hyper's 431 head with a JSON body: its `content-length` replaced, a `content-type` added.
fn answer_431(head: &[u8]) -> Vec<u8> {
    let body = serde_json::json!({
        "code": baton_shared::error::ErrorCode::HeadersTooLarge.as_str(),
        "message": format!(
            "the request's header fields are over the hub's bound: at most {HEADER_FIELDS_MAX} fields and \
             {HEADER_BYTES_MAX} bytes of request head"
        ),
    })
    .to_string();
    let text = String::from_utf8_lossy(head);
    let mut out = String::new();
    for line in text.split("\r\n").filter(|l| !l.is_empty()) {
        if !line.to_ascii_lowercase().starts_with("content-length:") {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str(&format!("content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len()));
    out.into_bytes()
}

/// Where `needle` first appears in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl<T: AsyncRead + Unpin> AsyncRead for Answer431<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Answer431<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        ready!(self.drain(cx))?;
        match find(buf, HYPER_431) {
            // What comes before it (an earlier answer) first.
            Some(at) if at > 0 => Pin::new(&mut self.inner).poll_write(cx, &buf[..at]),
            Some(_) => match find(buf, b"\r\n\r\n") {
                Some(end) => {
                    self.pending = Some((answer_431(&buf[..end + 4]), 0));
                    // Taken: what is not written yet goes out before anything else.
                    if let Poll::Ready(Err(e)) = self.drain(cx) {
                        return Poll::Ready(Err(e));
                    }
                    Poll::Ready(Ok(end + 4))
                }
                None => Pin::new(&mut self.inner).poll_write(cx, buf),
            },
            None => Pin::new(&mut self.inner).poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
