//! Shared by the streamed-fill tests: a response body the test feeds chunk
//! by chunk, and the byte helpers they check bodies with.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use tokio::sync::mpsc;

/// One chunk of an origin body, or the error that ends it.
pub type Chunk = Result<Bytes, std::io::Error>;

/// A response body the test writes into.
pub struct ChanBody(pub mpsc::UnboundedReceiver<Chunk>);

impl Body for ChanBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|c| c.map(|r| r.map(Frame::data)))
    }
}

pub fn digest(b: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

/// `count` chunks of `size` bytes, each with distinct content.
pub fn chunks(count: usize, size: usize) -> Vec<Bytes> {
    (0..count)
        .map(|i| Bytes::from((0..size).map(|j| (i * 31 + j) as u8).collect::<Vec<u8>>()))
        .collect()
}

pub fn concat(chunks: &[Bytes]) -> Vec<u8> {
    chunks.iter().flat_map(|c| c.iter().copied()).collect()
}

/// Let every spawned task run until it waits (paused time only).
pub async fn settle() {
    tokio::time::sleep(Duration::from_millis(5)).await;
}
