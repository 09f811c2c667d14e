//! A tiny `--flag value` parser: benches must not pull in a CLI crate.

use std::collections::HashMap;
use std::str::FromStr;

/// Flags given after `cargo bench --bench NAME --`.
#[derive(Debug, Default)]
pub(crate) struct Args {
    values: HashMap<String, String>,
    switches: Vec<String>,
    words: Vec<String>,
}

impl Args {
    /// Parse `std::env::args`. `--bench` (added by cargo) is ignored; a flag
    /// not in `known` is an error so a typo never silently runs defaults.
    pub(crate) fn parse(known: &[&str], usage: &str) -> Self {
        let mut args = Args::default();
        let mut it = std::env::args().skip(1).peekable();
        while let Some(a) = it.next() {
            if a == "--bench" {
                continue;
            }
            if a == "--help" || a == "-h" {
                println!("{usage}");
                std::process::exit(0);
            }
            let Some(flag) = a.strip_prefix("--") else {
                // A bare word is a name filter (`cargo bench --bench X -- tower`).
                args.words.push(a);
                continue;
            };
            let (name, inline) = match flag.split_once('=') {
                Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
                None => (flag.to_owned(), None),
            };
            if !known.contains(&name.as_str()) {
                eprintln!("unknown flag --{name}\n{usage}");
                std::process::exit(2);
            }
            let value = inline.or_else(|| it.next_if(|next| !next.starts_with("--")));
            match value {
                Some(v) => {
                    args.values.insert(name, v);
                }
                None => args.switches.push(name),
            }
        }
        args
    }

    /// The flag's value parsed as `T`, or `default` when absent.
    pub(crate) fn get<T: FromStr>(&self, name: &str, default: T) -> T {
        match self.values.get(name) {
            Some(v) => v.parse().unwrap_or_else(|_| {
                eprintln!("--{name}: cannot parse {v:?}");
                std::process::exit(2);
            }),
            None => default,
        }
    }

    /// The flag's raw value, if given.
    pub(crate) fn value(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// The bare words given, in order: name filters for benches that have names.
    pub(crate) fn words(&self) -> &[String] {
        &self.words
    }

    /// Whether a value-less switch was given.
    pub(crate) fn switch(&self, name: &str) -> bool {
        self.switches.iter().any(|s| s == name)
    }
}
