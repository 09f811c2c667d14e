//! Tests of the access log: line formats, several threads, drops.

use super::*;

fn entry() -> Entry<'static> {
    Entry {
        method: "GET",
        path: "/a b\"c",
        status: 200,
        cache_status: "herdguard; hit",
        upstream_us: None,
        total_us: 250,
    }
}

/// Known instants format as RFC 3339 (epoch, a leap day, the end of a year).
#[test]
fn timestamps_are_rfc3339() {
    for (secs, want) in [
        (0, "1970-01-01T00:00:00"),
        (951_782_400, "2000-02-29T00:00:00"),
        (1_798_761_599, "2026-12-31T23:59:59"),
    ] {
        let mut s = String::new();
        write_rfc3339_seconds(&mut s, secs);
        assert_eq!(s, want);
    }
}

/// Microseconds print as milliseconds with three decimals, as `{:.3}` of
/// the float did.
#[test]
fn millis_have_three_decimals() {
    for (us, want) in [
        (0, "0.000"),
        (5, "0.005"),
        (250, "0.250"),
        (1_234_567, "1234.567"),
    ] {
        let mut buf = Vec::new();
        push_millis(&mut buf, us);
        assert_eq!(buf, want.as_bytes());
    }
}

/// Control characters become `\uXXXX` with four lowercase hex digits.
#[test]
fn controls_escape_as_four_hex_digits() {
    let mut buf = Vec::new();
    escape_into(&mut buf, "a\tb\u{1}\u{9f}é", true);
    assert_eq!(buf, "a\\u0009b\\u0001\\u009fé".as_bytes());
}

/// Text and JSON lines reach the file, escaped, once the writer finishes.
#[test]
fn lines_reach_the_file_escaped() {
    let dir = std::env::temp_dir().join(format!("hg-access-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for format in [Format::Text, Format::Json] {
        let path = dir.join(format!("{format:?}.log"));
        let _ = std::fs::remove_file(&path);
        let (log, writer) = start(Destination::File(path.clone()), format).unwrap();
        log.record(&entry());
        log.record(&Entry {
            upstream_us: Some(1500),
            ..entry()
        });
        writer.finish();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        match format {
            Format::Text => {
                assert!(
                    lines[0].ends_with(" GET /a\\u0020b\\\"c 200 0.250 - \"herdguard; hit\""),
                    "{}",
                    lines[0]
                );
                assert!(lines[1].contains(" 200 0.250 1.500 "), "{}", lines[1]);
            }
            Format::Json => {
                assert!(
                    lines[0].contains(
                        "\"method\":\"GET\",\"path\":\"/a b\\\"c\",\"status\":200,\
                         \"cache_status\":\"herdguard; hit\",\"upstream_ms\":null,\"total_ms\":0.250}"
                    ),
                    "{}",
                    lines[0]
                );
                assert!(lines[1].contains("\"upstream_ms\":1.500,"), "{}", lines[1]);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// With the writer stuck, a thread's lines past its buffer's bound are
/// dropped and counted, and `record` returns at once.
#[test]
fn a_stuck_writer_drops_and_counts_lines() {
    // No writer thread: the buffer only fills.
    let log = AccessLog {
        shared: Arc::new(Shared::new(Format::Text)),
    };
    let held = || log.shared.slots()[0].lock().buf.len();
    log.record(&entry());
    let line_len = held();
    let fit = MAX_BUFFERED.div_ceil(line_len);
    for _ in 1..fit + 10 {
        log.record(&entry());
    }
    assert_eq!(log.dropped(), 10);
    assert_eq!(held(), fit * line_len);
}

/// Lines logged by several threads at once all reach the file, each
/// thread's in the order it logged them.
#[test]
fn every_threads_lines_reach_the_file_in_order() {
    const THREADS: usize = 4;
    const LINES: usize = 2000;
    let path = std::env::temp_dir().join(format!("hg-access-threads-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let (log, writer) = start(Destination::File(path.clone()), Format::Text).unwrap();
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let log = log.clone();
            scope.spawn(move || {
                for i in 0..LINES {
                    log.record(&Entry {
                        path: &format!("/{t}/{i}"),
                        ..entry()
                    });
                }
            });
        }
    });
    writer.finish();
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let mut next = [0; THREADS];
    for line in text.lines() {
        let target = line.split(' ').nth(2).unwrap();
        let (t, i) = target[1..].split_once('/').unwrap();
        let t: usize = t.parse().unwrap();
        assert_eq!(
            i.parse::<usize>().unwrap(),
            next[t],
            "thread {t}'s lines in order"
        );
        next[t] += 1;
    }
    assert_eq!(next, [LINES; THREADS], "every line written once");
    assert_eq!(log.dropped(), 0);
}

/// A thread that has ended leaves its lines to be written and its
/// buffer to be forgotten: the writer holds no buffer for it after.
#[test]
fn an_ended_threads_buffer_is_written_then_forgotten() {
    let path = std::env::temp_dir().join(format!("hg-access-ended-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let (log, writer) = start(Destination::File(path.clone()), Format::Text).unwrap();
    let on_thread = log.clone();
    std::thread::spawn(move || on_thread.record(&entry()))
        .join()
        .unwrap();
    writer.finish();
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        log.shared.slots().is_empty(),
        "the ended thread's buffer is forgotten"
    );
}

/// A thread whose lines pass [`FLUSH_BYTES`] wakes the writer at once:
/// they reach the file long before [`FLUSH_EVERY`] would have passed.
#[test]
fn a_full_buffer_wakes_the_writer() {
    let path = std::env::temp_dir().join(format!("hg-access-full-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let started = std::time::Instant::now();
    let (log, writer) = start(Destination::File(path.clone()), Format::Text).unwrap();
    log.record(&entry());
    let line_len = log.shared.slots()[0].lock().buf.len();
    // The last of these passes FLUSH_BYTES.
    for _ in 0..FLUSH_BYTES / line_len {
        log.record(&entry());
    }
    let written = || std::fs::metadata(&path).map_or(0, |m| m.len());
    while written() < FLUSH_BYTES as u64 {
        assert!(
            started.elapsed() < FLUSH_EVERY * 6 / 10,
            "the writer slept through a full buffer"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    writer.finish();
    let _ = std::fs::remove_file(&path);
}
