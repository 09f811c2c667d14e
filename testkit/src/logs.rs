//! What a test logs: everything `tracing` records on the current thread
//! while a [`Logs::capture`] guard lives, kept as text to search (for
//! example, that no credential reaches a log line).

use std::io::Write;
use std::sync::{Arc, Mutex};

/// Everything logged on this thread while the guard lives, as text.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Record every level into these logs until the guard is dropped.
    pub fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let sink = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    /// What was logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}
