//! Scraping a replica's metrics endpoint over a plain `TcpStream` and
//! parsing the OpenMetrics text strictly.
#![allow(clippy::unwrap_used, dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One request over a fresh connection; the status code and the body.
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

/// A parsed exposition: each sample's `name{labels}` and value.
pub struct Exposition {
    /// Each sample's `name{labels}` and value.
    pub samples: BTreeMap<String, f64>,
}

impl Exposition {
    /// Parses the OpenMetrics text, failing on any line out of form.
    pub fn parse(text: &str) -> Self {
        let mut declared: BTreeMap<String, String> = BTreeMap::new();
        let mut helped = BTreeSet::new();
        let mut samples = BTreeMap::new();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines.last(),
            Some(&"# EOF"),
            "the exposition ends with # EOF"
        );
        assert!(text.ends_with("# EOF\n"));
        for line in &lines[..lines.len() - 1] {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap();
                assert!(helped.insert(name.to_owned()), "HELP twice for {name}");
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(
                    ["counter", "gauge", "histogram"].contains(&kind),
                    "type {kind} of {name}"
                );
                assert!(helped.contains(name), "TYPE before HELP for {name}");
                let again = declared.insert(name.to_owned(), kind.to_owned());
                assert!(again.is_none(), "family {name} declared twice");
                continue;
            }
            assert!(!line.starts_with('#'), "unexpected comment {line:?}");
            let (series, value) = line.rsplit_once(' ').unwrap();
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("value of {line:?}"));
            let name = series.split('{').next().unwrap();
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                "name {name:?}"
            );
            if let Some(labels) = series.strip_prefix(name)
                && !labels.is_empty()
            {
                assert!(
                    labels.starts_with('{') && labels.ends_with('}'),
                    "labels of {line:?}"
                );
            }
            let family = declared
                .iter()
                .find(|(f, kind)| {
                    let suffixes: &[&str] = match kind.as_str() {
                        "counter" => &["_total"],
                        "histogram" => &["_bucket", "_sum", "_count"],
                        _ => &[""],
                    };
                    suffixes.iter().any(|s| name == format!("{f}{s}"))
                })
                .map(|(f, _)| f.clone());
            assert!(family.is_some(), "sample {name} of no declared family");
            let again = samples.insert(series.to_owned(), value);
            assert!(again.is_none(), "sample {series} twice");
        }
        Self { samples }
    }

    /// The sum of every sample named `name` whose labels contain each of
    /// `labels` (`key="value"`).
    pub fn sum(&self, name: &str, labels: &[&str]) -> f64 {
        self.samples
            .iter()
            .filter(|(series, _)| {
                let (n, rest) = series.split_once('{').unwrap_or((series.as_str(), ""));
                n == name && labels.iter().all(|l| rest.contains(l))
            })
            .map(|(_, v)| *v)
            .sum()
    }

    pub fn has(&self, name: &str) -> bool {
        self.samples
            .keys()
            .any(|s| s.split('{').next() == Some(name))
    }
}

pub fn scrape(addr: SocketAddr) -> Exposition {
    let (status, body) = http_get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    // For a look at the text: REPLOG_METRICS_DUMP=FILE keeps the last one.
    if let Ok(path) = std::env::var("REPLOG_METRICS_DUMP") {
        std::fs::write(path, &body).unwrap();
    }
    Exposition::parse(&body)
}
