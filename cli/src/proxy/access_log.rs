//! The access log: one line per request, written off the request path.
//!
//! A request appends its line to its own thread's buffer under a lock only
//! the writer ever shares (no `.await`, no I/O, no allocation once the
//! buffer has grown, no cache line that the other worker threads write)
//! and goes on. One writer thread swaps each thread's buffer for its spare
//! and writes it out when a buffer holds [`FLUSH_BYTES`] or [`FLUSH_EVERY`]
//! has passed, as nginx's `access_log ... buffer=256k flush=1s` does for
//! each of its workers. So lines of one thread keep their order, and lines
//! of different threads within one flush are written thread by thread, not
//! by time. When the writer falls behind (a slow disk, a blocked pipe) and
//! a thread's buffer holds [`MAX_BUFFERED`] bytes, its new lines are
//! dropped, never waited for, and counted in [`DROPPED_METRIC`]: a log
//! must not slow the answers it records.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A thread's lines waiting past this size wake the writer before
/// [`FLUSH_EVERY`].
pub const FLUSH_BYTES: usize = 256 * 1024;
/// The longest a written line waits in memory.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Bytes one thread holds for the writer; past it that thread's lines are
/// dropped and counted. Requests are logged by the runtime's worker
/// threads, one per core: the whole log holds at most that many times this.
pub const MAX_BUFFERED: usize = 1024 * 1024;
/// Counter of access-log lines dropped because the writer fell behind.
pub const DROPPED_METRIC: &str = "herdguard_access_log_dropped_lines_total";
/// How long the last lines may take to reach the disk at exit.
const FINISH_WAIT: Duration = Duration::from_secs(5);

/// Where the lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    Stdout,
    Stderr,
    /// Appended to, created if missing.
    File(PathBuf),
}

impl Destination {
    /// `off` (None), `stdout`, `stderr`, or a file path. `true`/`on` and
    /// `false` are the flag's older boolean spellings (stderr / off).
    pub fn parse(s: &str) -> Result<Option<Self>, String> {
        match s.trim() {
            "" => Err("--access-log needs a value: a file path, stdout, stderr or off".into()),
            "off" | "false" => Ok(None),
            "stdout" => Ok(Some(Self::Stdout)),
            "stderr" | "on" | "true" => Ok(Some(Self::Stderr)),
            path => Ok(Some(Self::File(PathBuf::from(path)))),
        }
    }
}

/// Line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `time method target status total_ms upstream_ms "cache-status"`.
    Text,
    /// One JSON object per line.
    Json,
}

/// One request, as the log records it.
#[derive(Debug)]
pub struct Entry<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub status: u16,
    pub cache_status: &'a str,
    /// Microseconds; None when no upstream call was made for this request.
    pub upstream_us: Option<u64>,
    /// Microseconds, written as milliseconds with 3 decimals.
    pub total_us: u64,
}

/// A number in decimal, by `itoa` (no `fmt` machinery: `core::fmt::write`
/// and `pad_integral` showed in the profile of a hit).
fn push_u64(buf: &mut Vec<u8>, n: u64) {
    buf.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `.` and three digits: the fraction of a second or of a millisecond.
fn push_frac3(buf: &mut Vec<u8>, n: u32) {
    let n = n % 1000;
    // Each digit is below 10, so the casts are exact.
    let digit = |d: u32| b'0' + d as u8;
    buf.extend_from_slice(&[b'.', digit(n / 100), digit(n / 10 % 10), digit(n % 10)]);
}

/// `us` as milliseconds with three decimals (`1.500`), by integer
/// arithmetic: float formatting showed in the profile of a hit.
fn push_millis(buf: &mut Vec<u8>, us: u64) {
    push_u64(buf, us / 1000);
    // Below 1000: fits.
    push_frac3(buf, (us % 1000) as u32);
}

/// One thread's lines waiting for the writer.
#[derive(Debug)]
struct Lines {
    buf: Vec<u8>,
    /// The formatted `YYYY-MM-DDTHH:MM:SS` of `second`: made once a second.
    second: u64,
    stamp: String,
}

/// One thread's buffer: locked by that thread for each line and by the
/// writer for a swap.
#[derive(Debug)]
struct Slot(Mutex<Lines>);

impl Slot {
    fn new() -> Self {
        Self(Mutex::new(Lines {
            buf: Vec::new(),
            second: u64::MAX,
            stamp: String::with_capacity(24),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Lines> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug)]
struct Shared {
    /// Every logging thread's buffer, by the time it first logged.
    slots: Mutex<Vec<Arc<Slot>>>,
    /// Set once [`Writer::finish`] is called; the writer sleeps on it.
    closed: Mutex<bool>,
    wake: Condvar,
    dropped: AtomicU64,
    format: Format,
}

impl Shared {
    fn new(format: Format) -> Self {
        Self {
            slots: Mutex::new(Vec::new()),
            closed: Mutex::new(false),
            wake: Condvar::new(),
            dropped: AtomicU64::new(0),
            format,
        }
    }

    fn slots(&self) -> MutexGuard<'_, Vec<Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether some thread's lines already call for a write.
    fn any_full(&self) -> bool {
        self.slots()
            .iter()
            .any(|s| s.lock().buf.len() >= FLUSH_BYTES)
    }

    fn drop_line(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(DROPPED_METRIC).increment(1);
    }
}

thread_local! {
    /// This thread's buffer in each log it has written to (one, but in
    /// tests), with the log it belongs to.
    static SLOTS: RefCell<Vec<(Weak<Shared>, Arc<Slot>)>> = const { RefCell::new(Vec::new()) };
}

/// The handle requests log through; cheap to clone.
#[derive(Debug, Clone)]
pub struct AccessLog {
    shared: Arc<Shared>,
}

/// The writer thread; [`Writer::finish`] writes what is left and stops it.
#[derive(Debug)]
pub struct Writer {
    shared: Arc<Shared>,
    done: std::sync::mpsc::Receiver<()>,
}

/// Start the writer thread for `dest`.
///
/// # Errors
/// The file cannot be opened for appending, or the thread cannot start.
pub fn start(dest: Destination, format: Format) -> Result<(AccessLog, Writer), String> {
    let mut out: Box<dyn std::io::Write + Send> = match &dest {
        Destination::Stdout => Box::new(std::io::stdout()),
        Destination::Stderr => Box::new(std::io::stderr()),
        Destination::File(path) => Box::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("cannot open the access log {}: {e}", path.display()))?,
        ),
    };
    let shared = Arc::new(Shared::new(format));
    let (done_tx, done) = std::sync::mpsc::channel();
    let writer_shared = Arc::clone(&shared);
    std::thread::Builder::new()
        .name("herdguard-access-log".into())
        .spawn(move || {
            write_until_closed(&writer_shared, out.as_mut());
            let _ = done_tx.send(());
        })
        .map_err(|e| format!("cannot start the access-log writer: {e}"))?;
    Ok((
        AccessLog {
            shared: Arc::clone(&shared),
        },
        Writer { shared, done },
    ))
}

/// The writer thread's loop: each time a buffer is full or
/// [`FLUSH_EVERY`] has passed, write out every thread's lines; after
/// [`Writer::finish`], once more, then stop.
fn write_until_closed(shared: &Shared, out: &mut dyn std::io::Write) {
    let mut spare = Vec::with_capacity(FLUSH_BYTES * 2);
    loop {
        let closed = {
            let closed = shared.closed.lock().unwrap_or_else(PoisonError::into_inner);
            if *closed || shared.any_full() {
                *closed
            } else {
                let (closed, _) = shared
                    .wake
                    .wait_timeout(closed, FLUSH_EVERY)
                    .unwrap_or_else(PoisonError::into_inner);
                *closed
            }
        };
        // A buffer only this list holds belongs to a thread that has
        // ended: it can take no more lines, so it is written once more and
        // forgotten. The rest are written from a copy of the list, so a
        // thread that registers never waits for the disk.
        let (live, gone): (Vec<Arc<Slot>>, Vec<Arc<Slot>>) = {
            let mut slots = shared.slots();
            let (gone, live) = std::mem::take(&mut *slots)
                .into_iter()
                .partition(|s| Arc::strong_count(s) == 1);
            slots.clone_from(&live);
            (live, gone)
        };
        for slot in live.iter().chain(&gone) {
            write_slot(slot, &mut spare, out);
        }
        if closed {
            break;
        }
    }
}

/// Swap `slot`'s lines for `spare` and write them out.
fn write_slot(slot: &Slot, spare: &mut Vec<u8>, out: &mut dyn std::io::Write) {
    {
        let mut lines = slot.lock();
        if lines.buf.is_empty() {
            return;
        }
        std::mem::swap(&mut lines.buf, spare);
    }
    // A failed write loses these lines, not the proxy.
    let _ = out.write_all(spare).and_then(|()| out.flush());
    spare.clear();
    // Give back memory a burst made the spare grow to.
    spare.shrink_to(FLUSH_BYTES * 2);
}

/// Describe the dropped-lines counter and show it at 0 before any drop, on
/// the metrics recorder installed now.
pub fn register_metric() {
    metrics::describe_counter!(
        DROPPED_METRIC,
        "access-log lines dropped because the writer fell behind"
    );
    metrics::counter!(DROPPED_METRIC).absolute(0);
}

impl Writer {
    /// Write every line logged so far and stop the thread; waits at most
    /// `FINISH_WAIT` for a slow destination.
    pub fn finish(self) {
        *self
            .shared
            .closed
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = true;
        self.shared.wake.notify_one();
        let _ = self.done.recv_timeout(FINISH_WAIT);
    }
}

impl AccessLog {
    /// Append one line to this thread's buffer; never waits for the disk.
    pub fn record(&self, e: &Entry<'_>) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        // Not while the thread's locals are being torn down (a line logged
        // at thread exit): that line is dropped.
        let logged = SLOTS.try_with(|slots| {
            let Ok(mut slots) = slots.try_borrow_mut() else {
                return false;
            };
            let slot = match slots
                .iter()
                .position(|(log, _)| std::ptr::eq(log.as_ptr(), Arc::as_ptr(&self.shared)))
            {
                Some(i) => &slots[i].1,
                None => self.register(&mut slots),
            };
            // The slot's lock is let go at the end of this statement,
            // before the writer's (the writer takes its own, then the slots').
            let full = self.append(&mut slot.lock(), now, e);
            if full {
                self.wake_writer();
            }
            true
        });
        if logged != Ok(true) {
            self.shared.drop_line();
        }
    }

    /// Wake the writer for a buffer that has just filled. Taking its lock
    /// first means it is either before its check of the buffers (and will
    /// see this one full) or already asleep (and is woken): the wake-up
    /// cannot fall between the two and leave it asleep for a whole
    /// [`FLUSH_EVERY`].
    fn wake_writer(&self) {
        drop(
            self.shared
                .closed
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        self.shared.wake.notify_one();
    }

    /// Give this thread a buffer in this log, forgetting those of logs
    /// that are gone.
    fn register<'a>(&self, slots: &'a mut Vec<(Weak<Shared>, Arc<Slot>)>) -> &'a Arc<Slot> {
        slots.retain(|(log, _)| log.strong_count() > 0);
        let slot = Arc::new(Slot::new());
        self.shared.slots().push(Arc::clone(&slot));
        slots.push((Arc::downgrade(&self.shared), slot));
        &slots[slots.len() - 1].1
    }

    /// Format one line into `p`, or drop it when `p` is full. True when
    /// this line filled `p` past [`FLUSH_BYTES`].
    fn append(&self, p: &mut Lines, now: Duration, e: &Entry<'_>) -> bool {
        if p.buf.len() >= MAX_BUFFERED {
            self.shared.drop_line();
            return false;
        }
        let secs = now.as_secs();
        if p.second != secs {
            p.second = secs;
            p.stamp.clear();
            write_rfc3339_seconds(&mut p.stamp, secs);
        }
        let start = p.buf.len();
        let buf = &mut p.buf;
        let millis = now.subsec_millis();
        match self.shared.format {
            Format::Text => {
                buf.extend_from_slice(p.stamp.as_bytes());
                push_frac3(buf, millis);
                buf.extend_from_slice(b"Z ");
                buf.extend_from_slice(e.method.as_bytes());
                buf.push(b' ');
                escape_into(buf, e.path, false);
                buf.push(b' ');
                push_u64(buf, u64::from(e.status));
                buf.push(b' ');
                push_millis(buf, e.total_us);
                buf.push(b' ');
                match e.upstream_us {
                    Some(us) => push_millis(buf, us),
                    None => buf.push(b'-'),
                }
                buf.extend_from_slice(b" \"");
                escape_into(buf, e.cache_status, true);
                buf.extend_from_slice(b"\"\n");
            }
            Format::Json => {
                buf.extend_from_slice(b"{\"timestamp\":\"");
                buf.extend_from_slice(p.stamp.as_bytes());
                push_frac3(buf, millis);
                buf.extend_from_slice(b"Z\",\"target\":\"herdguard::access\",\"method\":\"");
                escape_into(buf, e.method, true);
                buf.extend_from_slice(b"\",\"path\":\"");
                escape_into(buf, e.path, true);
                buf.extend_from_slice(b"\",\"status\":");
                push_u64(buf, u64::from(e.status));
                buf.extend_from_slice(b",\"cache_status\":\"");
                escape_into(buf, e.cache_status, true);
                buf.extend_from_slice(b"\",\"upstream_ms\":");
                match e.upstream_us {
                    Some(us) => push_millis(buf, us),
                    None => buf.extend_from_slice(b"null"),
                }
                buf.extend_from_slice(b",\"total_ms\":");
                push_millis(buf, e.total_us);
                buf.extend_from_slice(b"}\n");
            }
        }
        p.buf.len() >= FLUSH_BYTES && start < FLUSH_BYTES
    }

    /// Lines dropped so far because the writer fell behind.
    #[cfg(test)]
    fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

/// Copy `s`, escaping what would break the line or the JSON string: quotes,
/// backslashes and control characters (a header value or target can carry
/// any of them). In text lines, spaces are escaped too, so fields stay
/// space-separated.
fn escape_into(buf: &mut Vec<u8>, s: &str, keep_spaces: bool) {
    // Most targets and statuses need no escape: one copy (the per-char
    // loop showed in the profile of a hit).
    let plain = |b: &u8| {
        matches!(b, 0x21..=0x7e if *b != b'"' && *b != b'\\') || (*b == b' ' && keep_spaces)
    };
    if s.as_bytes().iter().all(plain) {
        buf.extend_from_slice(s.as_bytes());
        return;
    }
    for c in s.chars() {
        match c {
            '"' => buf.extend_from_slice(b"\\\""),
            '\\' => buf.extend_from_slice(b"\\\\"),
            ' ' if !keep_spaces => buf.extend_from_slice(b"\\u0020"),
            c if c.is_control() => {
                // Controls are below U+00A0: four hex digits.
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let n = u32::from(c) as usize;
                buf.extend_from_slice(b"\\u");
                buf.extend_from_slice(&[
                    HEX[n >> 12 & 15],
                    HEX[n >> 8 & 15],
                    HEX[n >> 4 & 15],
                    HEX[n & 15],
                ]);
            }
            c => {
                let mut b = [0; 4];
                buf.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
            }
        }
    }
}

/// `YYYY-MM-DDTHH:MM:SS` (UTC) of a Unix time, by the civil-from-days
/// algorithm (H. Hinnant), so no date crate is needed.
fn write_rfc3339_seconds(out: &mut String, secs: u64) {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let _ = write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    );
}

#[cfg(test)]
#[path = "access_log_tests.rs"]
mod tests;
