//! A connection's IO whose writes must make progress: a write (or flush, or shutdown) that stays
//! pending longer than the timeout fails with `TimedOut`, which ends the connection.
//!
//! hyper's `header_read_timeout` bounds reading a request head, and nothing bounds writing an
//! answer: a client that pipelines requests and never reads the answers would keep its
//! connection (its task, its buffers, its descriptor) forever once the socket buffers are full.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `T` whose writes fail once they have been pending for `timeout` without any progress (a
/// write that completes, even partly, starts the clock again). A zero timeout: none.
pub(crate) struct WriteTimeout<T> {
    io: T,
    timeout: Duration,
    /// Running while a write is pending: since when nothing could be written.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> WriteTimeout<T> {
    pub(crate) fn new(io: T, timeout: Duration) -> Self {
        WriteTimeout {
            io,
            timeout,
            stalled: None,
        }
    }

    /// Passes `poll` through, timing how long it has been pending.
    fn watch<R>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        match poll {
            Poll::Ready(result) => {
                self.stalled = None;
                Poll::Ready(result)
            }
            Poll::Pending if self.timeout.is_zero() => Poll::Pending,
            Poll::Pending => {
                let timeout = self.timeout;
                let stalled = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match stalled.as_mut().poll(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(()) => {
                        self.stalled = None;
                        Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("the peer read nothing for {timeout:?} (write_timeout)"),
                        )))
                    }
                }
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_write(cx, buf);
        this.watch(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.watch(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_flush(cx);
        this.watch(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_shutdown(cx);
        this.watch(cx, poll)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_write_that_makes_no_progress_fails_after_the_timeout() {
        // A pipe nobody reads: 64 bytes fit, then every write is pending.
        let (near, _far) = tokio::io::duplex(64);
        let mut io = WriteTimeout::new(near, Duration::from_secs(5));
        let started = tokio::time::Instant::now();
        let err = io.write_all(&[0; 1024]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn progress_starts_the_clock_again() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut io = WriteTimeout::new(near, Duration::from_secs(5));
        // The reader takes 64 bytes every 3 s: slower than the writer, never stalled 5 s.
        let reader = tokio::spawn(async move {
            let mut buf = [0; 64];
            let mut read = 0;
            while read < 1024 {
                tokio::time::sleep(Duration::from_secs(3)).await;
                read += tokio::io::AsyncReadExt::read(&mut far, &mut buf)
                    .await
                    .unwrap();
            }
        });
        io.write_all(&[0; 1024]).await.unwrap();
        reader.await.unwrap();
    }
}
