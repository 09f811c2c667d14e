use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;

use super::pace::STALL_GRACE;
use super::reader::CUT_OFF;
use super::*;
use crate::error::BoxError;
use crate::http::response::CachedResponse;
use crate::key::CacheKey;
use crate::store::memory::Stored;
use std::future::{poll_fn, Future};

async fn next(r: &mut StreamReader) -> Option<Result<Bytes, BoxError>> {
    poll_fn(|cx| r.poll_chunk(cx)).await
}

/// Every reader gets every chunk, the very same allocation.
#[tokio::test]
async fn readers_share_chunks() {
    let body = SharedBody::new("test", Duration::from_secs(60));
    let mut a = body.reader(None).unwrap();
    let mut b = body.reader(None).unwrap();
    let chunk = Bytes::from_static(b"hello");
    body.push(chunk.clone());
    body.finish();
    let ga = next(&mut a).await.unwrap().unwrap();
    let gb = next(&mut b).await.unwrap().unwrap();
    assert_eq!(ga.as_ptr(), chunk.as_ptr());
    assert_eq!(gb.as_ptr(), chunk.as_ptr());
    assert!(next(&mut a).await.is_none());
    assert!(next(&mut b).await.is_none());
}

fn poll_now(r: &mut StreamReader) -> Poll<Option<Result<Bytes, BoxError>>> {
    r.poll_chunk(&mut Context::from_waker(Waker::noop()))
}

fn has_room(body: &SharedBody) -> bool {
    body.poll_room(&mut Context::from_waker(Waker::noop()))
        .is_ready()
}

const WINDOW: usize = 40;
const CHUNK: usize = 4;

fn chunk(i: usize) -> Bytes {
    Bytes::from(vec![i as u8; CHUNK])
}

/// Push chunks `from..` while the writer has room; how many it pushed.
fn fill(body: &SharedBody, from: usize, upto: usize) -> usize {
    let mut i = from;
    while i < upto && has_room(body) {
        body.push(chunk(i));
        i += 1;
        assert!(body.held() <= WINDOW + CHUNK, "held {}", body.held());
    }
    i
}

/// Read what `r` can read now; the first byte of each chunk, or the error.
fn drain(r: &mut StreamReader, got: &mut Vec<u8>) -> Option<String> {
    loop {
        match poll_now(r) {
            Poll::Ready(Some(Ok(c))) => got.push(c[0]),
            Poll::Ready(Some(Err(e))) => return Some(e.to_string()),
            Poll::Ready(None) | Poll::Pending => return None,
        }
    }
}

/// Readers that all go slowly pace the writer: it waits for them
/// instead of cutting them off, and never holds more than a window
/// plus a chunk.
#[test]
fn slow_readers_together_pace_the_writer() {
    const CHUNKS: usize = 100;
    let body = SharedBody::new("test", Duration::from_secs(60));
    body.to_window(WINDOW);
    let mut readers: Vec<_> = (0..3).map(|_| body.reader(None).unwrap()).collect();
    let mut got = vec![Vec::new(); 3];
    let (mut written, mut waits) = (0, 0);
    while got.iter().any(|g| g.len() < CHUNKS) {
        let before = written;
        written = fill(&body, written, CHUNKS);
        if written < CHUNKS && written - before < 2 {
            waits += 1;
        }
        if written == CHUNKS {
            body.finish();
        }
        // One chunk each per round: nobody ever reads everything there is.
        for (r, g) in readers.iter_mut().zip(&mut got) {
            if let Poll::Ready(Some(c)) = poll_now(r) {
                g.push(c.unwrap()[0]);
            }
        }
    }
    for g in got {
        assert_eq!(g, (0..CHUNKS as u8).collect::<Vec<_>>());
    }
    assert!(
        waits > 50,
        "the writer waited for the readers {waits} times"
    );
}

/// Two readers read a window at 1 ms a chunk, then wait for a third that
/// stalled after `started` chunks: how long after the first byte the
/// third is cut off (checked: it is, and the two get everything).
async fn stalled_third_cut_after(started: usize) -> Duration {
    let body = SharedBody::new("test", Duration::from_secs(60));
    body.to_window(WINDOW);
    let mut fast = [body.reader(None).unwrap(), body.reader(None).unwrap()];
    let mut stalled = body.reader(None).unwrap();
    let start = tokio::time::Instant::now();
    let written = fill(&body, 0, 100);
    assert_eq!(written * CHUNK, WINDOW);
    for _ in 0..started {
        assert!(poll_now(&mut stalled).is_ready());
    }
    let mut got = [Vec::new(), Vec::new()];
    for _ in 0..written {
        tokio::time::sleep(Duration::from_millis(1)).await;
        for (r, g) in fast.iter_mut().zip(&mut got) {
            let Poll::Ready(Some(Ok(c))) = poll_now(r) else {
                panic!("a chunk to read");
            };
            g.push(c[0]);
        }
    }
    // Now they wait for more.
    for r in &mut fast {
        assert!(poll_now(r).is_pending());
    }
    let more = fill(&body, written, 100);
    assert!(
        more - written <= started,
        "the stalled reader holds the fill back"
    );
    for (r, g) in fast.iter_mut().zip(&mut got) {
        assert_eq!(drain(r, g), None);
    }
    tokio::time::timeout(STALL_GRACE * 2, body.room())
        .await
        .expect("the stalled reader is cut off");
    let cut_after = start.elapsed();
    assert_eq!(
        drain(&mut stalled, &mut Vec::new()).as_deref(),
        Some(CUT_OFF)
    );
    let more = fill(&body, more, 100);
    for (r, g) in fast.iter_mut().zip(&mut got) {
        assert_eq!(drain(r, g), None);
        assert_eq!(*g, (0..more as u8).collect::<Vec<_>>());
    }
    assert!(body.reader(None).is_none(), "the first byte is gone");
    cut_after
}

/// A reader that has started and is less than a quarter as fast as
/// most is cut off once they have waited for it three times as long as
/// they read: 10 ms of reading, 30 ms of waiting.
#[tokio::test(start_paused = true)]
async fn reader_less_than_a_quarter_as_fast_as_most_is_cut_off() {
    assert_eq!(stalled_third_cut_after(1).await, Duration::from_millis(40));
}

/// A reader that has not read its first byte yet has the grace to start.
#[tokio::test(start_paused = true)]
async fn reader_not_started_has_the_grace() {
    let after = stalled_third_cut_after(0).await;
    assert_eq!(after, Duration::from_millis(10) + STALL_GRACE);
}

/// One fast reader and two stalled ones: the writer waits for the
/// majority, until the fast one has waited the grace.
#[tokio::test(start_paused = true)]
async fn fast_minority_waits_for_the_slow_majority_at_most_the_grace() {
    let body = SharedBody::new("test", Duration::from_secs(60));
    body.to_window(WINDOW);
    let mut fast = body.reader(None).unwrap();
    let mut stalled = [body.reader(None).unwrap(), body.reader(None).unwrap()];
    let (mut written, mut got) = (fill(&body, 0, 100), Vec::new());
    assert_eq!(drain(&mut fast, &mut got), None);
    assert_eq!(got.len(), written);
    assert!(!has_room(&body), "the majority holds the fill back");
    let start = tokio::time::Instant::now();
    tokio::time::timeout(STALL_GRACE * 3, body.room())
        .await
        .expect("the grace ends the wait");
    assert_eq!(start.elapsed(), STALL_GRACE);
    written = fill(&body, written, 100);
    assert!(written > got.len());
    for r in &mut stalled {
        assert_eq!(drain(r, &mut Vec::new()).as_deref(), Some(CUT_OFF));
    }
    assert_eq!(drain(&mut fast, &mut got), None);
    assert_eq!(got, (0..written as u8).collect::<Vec<_>>());
}

/// A reader that holds the fill back and makes no progress is cut off
/// after the stall bound, even when nobody waits for it.
#[tokio::test(start_paused = true)]
async fn idle_reader_is_cut_off_after_the_stall_bound() {
    let body = SharedBody::new("test", Duration::from_secs(60));
    body.to_window(WINDOW);
    let mut idle = body.reader(None).unwrap();
    fill(&body, 0, 100);
    let start = tokio::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(120), body.room())
        .await
        .expect("the idle reader is cut off");
    assert_eq!(start.elapsed(), Duration::from_secs(60));
    assert_eq!(drain(&mut idle, &mut Vec::new()).as_deref(), Some(CUT_OFF));
}

/// Records that it was woken.
struct Flag(std::sync::atomic::AtomicBool);

impl std::task::Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A parked writer is woken as soon as the last reader of the oldest
/// chunk moves on, not only when half the readers have read everything.
#[test]
fn freeing_the_oldest_chunk_wakes_the_writer() {
    let body = SharedBody::new("test", Duration::from_secs(60));
    body.to_window(WINDOW);
    let mut readers: Vec<_> = (0..3).map(|_| body.reader(None).unwrap()).collect();
    fill(&body, 0, 100);
    let flag = Arc::new(Flag(Default::default()));
    let waker = Waker::from(Arc::clone(&flag));
    assert!(body
        .poll_room(&mut Context::from_waker(&waker))
        .is_pending());
    for r in &mut readers[..2] {
        assert!(poll_now(r).is_ready());
    }
    assert!(!flag.0.load(Ordering::SeqCst), "a reader still needs it");
    assert!(poll_now(&mut readers[2]).is_ready());
    assert!(
        flag.0.load(Ordering::SeqCst),
        "nobody needs the oldest chunk"
    );
    assert!(has_room(&body));
}

/// Readers that leave stop holding the writer back; once all have
/// left, the fill is abandoned.
#[test]
fn leaving_readers_free_the_writer() {
    let body = SharedBody::new("test", Duration::from_secs(60));
    body.to_window(WINDOW);
    let mut fast = body.reader(None).unwrap();
    let stalled = [body.reader(None).unwrap(), body.reader(None).unwrap()];
    let written = fill(&body, 0, 100);
    assert_eq!(drain(&mut fast, &mut Vec::new()), None);
    assert!(!has_room(&body));
    drop(stalled);
    assert!(has_room(&body), "nobody left holds the oldest chunk");
    assert!(fill(&body, written, 100) > written);
    drop(fast);
    assert!(body.abandoned(), "nobody reads, and the start is gone");
}

/// A window of 0 bytes (`max_body_bytes(0)`, or a fill whose first frame
/// was empty when it outgrew storing): once every reader has read
/// everything there is, nothing is held, so the writer has room at once.
#[tokio::test(start_paused = true)]
async fn zero_window_with_every_reader_caught_up_has_room() {
    let body = SharedBody::new("test", Duration::from_secs(60));
    body.to_window(0);
    let mut r = body.reader(None).unwrap();
    let mut got = Vec::new();
    for i in 0..4 {
        let start = tokio::time::Instant::now();
        tokio::time::timeout(STALL_GRACE * 2, body.room())
            .await
            .expect("room");
        assert_eq!(start.elapsed(), Duration::ZERO, "chunk {i} waited");
        body.push(chunk(i));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(drain(&mut r, &mut got), None);
        assert!(poll_now(&mut r).is_pending(), "the reader is parked");
    }
    assert_eq!(got, vec![0, 1, 2, 3]);
}

/// With nobody reading, only the newest window is kept.
#[test]
fn no_reader_keeps_the_newest_window() {
    let body = SharedBody::new("test", Duration::from_secs(60));
    body.to_window(10);
    for _ in 0..5 {
        assert!(has_room(&body));
        body.push(Bytes::from(vec![0u8; 4]));
    }
    assert!(body.held() <= 12, "held {}", body.held());
    assert!(body.abandoned());
}

/// A failed fill ends every reader's body with an error.
#[tokio::test]
async fn failure_reaches_readers() {
    let body = SharedBody::new("test", Duration::from_secs(60));
    let mut a = body.reader(None).unwrap();
    body.push(Bytes::from_static(b"x"));
    drop(Writer {
        body: Arc::clone(&body),
        _offer: None,
    });
    assert!(next(&mut a).await.unwrap().is_ok());
    assert!(next(&mut a).await.unwrap().is_err());
}

/// A stream head for `key`, as a fill registers it.
fn stream_for(key: CacheKey) -> Arc<Stream> {
    let value = CachedResponse {
        status: StatusCode::OK,
        headers: http::HeaderMap::new(),
        body: Bytes::new(),
        vary: Vec::new(),
        initial_age: 0,
        url: key,
        route: None,
        rules: crate::http::policy::StoredRules::default(),
        revalidated: false,
        not_stored: None,
        served_head: Default::default(),
    };
    let head = Arc::new(Stored::new(
        value,
        crate::entry::envelope::EntryMeta::now(Default::default(), Default::default(), 0),
        Default::default(),
        Default::default(),
        Default::default(),
    ));
    Arc::new(Stream {
        head,
        body: SharedBody::new("test", Duration::from_secs(60)),
    })
}

/// A registration withdraws only its own offer.
#[test]
fn registration_removes_own() {
    let streams = Arc::new(Streams::new());
    let key = CacheKey::new("k");
    let first = streams.register(key, stream_for(key));
    let second = streams.register(key, stream_for(key));
    drop(first);
    assert_eq!(streams.len(), 1);
    drop(second);
    assert_eq!(streams.len(), 0);
}

/// A stream registered for one key wakes the waiters of that key, not the
/// waiters of keys in other shards: with one channel for all keys, every
/// fill that started streaming woke every waiting request of every key,
/// each of which locked the map to look again (a cold burst over K keys
/// made on the order of K² wake-ups).
#[test]
fn a_registration_wakes_only_its_shard() {
    let streams = Arc::new(Streams::new());
    let a = CacheKey::new("a");
    // Bounded: a broken shard function fails here instead of looping.
    let b = (0..10_000)
        .map(|i| CacheKey::new(format!("b{i}")))
        .find(|b| Streams::shard(b) != Streams::shard(&a))
        .expect("a key in another shard");
    let wakes = |key: CacheKey| {
        let woken = Arc::new(Flag(Default::default()));
        let waker = Waker::from(Arc::clone(&woken));
        let mut fut = Box::pin(streams.wait(key, |_: &Stream| true));
        let pending = fut.as_mut().poll(&mut Context::from_waker(&waker));
        assert!(pending.is_pending(), "nothing registered yet");
        (woken, fut, waker)
    };
    let (woken_a, _wait_a, _) = wakes(a);
    let (woken_b, mut wait_b, waker_b) = wakes(b);
    let _offer = streams.register(b, stream_for(b));
    assert!(
        !woken_a.0.load(Ordering::SeqCst),
        "another key's waiter woken"
    );
    assert!(
        woken_b.0.load(Ordering::SeqCst),
        "its own key's waiter not woken"
    );
    let got = wait_b.as_mut().poll(&mut Context::from_waker(&waker_b));
    assert!(matches!(got, Poll::Ready(s) if s.head.value.url == b));
}
