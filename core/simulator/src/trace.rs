//! What happened, in order: the schedule hash over every event and the
//! last few events kept for a failure report.
//!
//! An event is folded into the hash through a fixed little-endian
//! encoding (never `Debug` text, which may change with a dependency), so
//! two runs have the same hash exactly when they delivered the same frames
//! to the same shards at the same ticks, sent the same calls and saw the
//! same answers and faults.

use std::collections::VecDeque;
use std::fmt;

use xxhash_rust::xxh3::{Xxh3, xxh3_64};

/// Events kept for a failure report.
pub(crate) const TRACE_EVENTS_MAX: usize = 30;

/// One thing the driver did or saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// A frame reached a live shard.
    Deliver {
        tick: u64,
        from: u8,
        to: u8,
        shard: u16,
        len: usize,
        checksum: u64,
    },
    /// A client sent a call (or a metadata op) to a replica.
    Call {
        tick: u64,
        client: u8,
        replica: u8,
        what: String,
    },
    /// A call was answered (or given up on).
    Answer { tick: u64, client: u8, what: String },
    /// A fault was injected or healed.
    Fault { tick: u64, what: String },
    /// A replica's group changed view or status.
    State { tick: u64, what: String },
}

impl Event {
    fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        match self {
            Self::Deliver {
                tick,
                from,
                to,
                shard,
                len,
                checksum,
            } => {
                out.push(1);
                out.extend_from_slice(&tick.to_le_bytes());
                out.push(*from);
                out.push(*to);
                out.extend_from_slice(&shard.to_le_bytes());
                out.extend_from_slice(&(*len as u64).to_le_bytes());
                out.extend_from_slice(&checksum.to_le_bytes());
            }
            Self::Call {
                tick,
                client,
                replica,
                what,
            } => {
                out.push(2);
                out.extend_from_slice(&tick.to_le_bytes());
                out.push(*client);
                out.push(*replica);
                out.extend_from_slice(what.as_bytes());
            }
            Self::Answer { tick, client, what } => {
                out.push(3);
                out.extend_from_slice(&tick.to_le_bytes());
                out.push(*client);
                out.extend_from_slice(what.as_bytes());
            }
            Self::Fault { tick, what } => {
                out.push(4);
                out.extend_from_slice(&tick.to_le_bytes());
                out.extend_from_slice(what.as_bytes());
            }
            Self::State { tick, what } => {
                out.push(5);
                out.extend_from_slice(&tick.to_le_bytes());
                out.extend_from_slice(what.as_bytes());
            }
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Deliver {
                tick,
                from,
                to,
                shard,
                len,
                checksum,
            } => write!(
                f,
                "t{tick} deliver {from}->{to} shard {shard} ({len} bytes, {checksum:016x})"
            ),
            Self::Call {
                tick,
                client,
                replica,
                what,
            } => write!(f, "t{tick} client {client} -> replica {replica}: {what}"),
            Self::Answer { tick, client, what } => write!(f, "t{tick} client {client} <- {what}"),
            Self::Fault { tick, what } => write!(f, "t{tick} fault: {what}"),
            Self::State { tick, what } => write!(f, "t{tick} state: {what}"),
        }
    }
}

/// The schedule hash and the tail of the event stream.
pub(crate) struct Trace {
    hasher: Xxh3,
    recent: VecDeque<Event>,
    scratch: Vec<u8>,
    events: u64,
}

impl Trace {
    pub(crate) fn new(seed: u64) -> Self {
        let mut hasher = Xxh3::new();
        hasher.update(&seed.to_le_bytes());
        Self {
            hasher,
            recent: VecDeque::with_capacity(TRACE_EVENTS_MAX),
            scratch: Vec::with_capacity(64),
            events: 0,
        }
    }

    /// Folds `event` into the hash and keeps it among the recent ones.
    pub(crate) fn record(&mut self, event: Event) {
        match &event {
            Event::Fault { tick, what } => tracing::info!(tick, what = what.as_str(), "fault"),
            Event::State { tick, what } => tracing::debug!(tick, what = what.as_str(), "state"),
            Event::Call { .. } | Event::Answer { .. } => tracing::debug!(%event, "client"),
            Event::Deliver { .. } => tracing::trace!(%event, "frame"),
        }
        event.encode(&mut self.scratch);
        self.hasher
            .update(&(self.scratch.len() as u32).to_le_bytes());
        self.hasher.update(&self.scratch);
        self.events += 1;
        if self.recent.len() == TRACE_EVENTS_MAX {
            self.recent.pop_front();
        }
        self.recent.push_back(event);
    }

    /// A delivered frame.
    pub(crate) fn deliver(&mut self, tick: u64, from: u8, to: u8, shard: u16, bytes: &[u8]) {
        self.record(Event::Deliver {
            tick,
            from,
            to,
            shard,
            len: bytes.len(),
            checksum: xxh3_64(bytes),
        });
    }

    /// The hash of everything recorded so far.
    pub(crate) fn hash(&self) -> u64 {
        self.hasher.digest()
    }

    /// Events recorded so far.
    pub(crate) fn events(&self) -> u64 {
        self.events
    }

    /// The last events, oldest first, as lines.
    pub(crate) fn recent(&self) -> Vec<String> {
        self.recent.iter().map(ToString::to_string).collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn fault(tick: u64) -> Event {
        Event::Fault {
            tick,
            what: "x".into(),
        }
    }

    #[test]
    fn given_same_events_when_hashed_should_agree_and_differ_on_any_change() {
        let mut a = Trace::new(1);
        let mut b = Trace::new(1);
        let mut c = Trace::new(1);
        for t in 0..5 {
            a.record(fault(t));
            b.record(fault(t));
            c.record(fault(if t == 3 { 9 } else { t }));
        }
        assert_eq!(a.hash(), b.hash());
        assert_ne!(a.hash(), c.hash());
        assert_ne!(Trace::new(1).hash(), Trace::new(2).hash());
    }

    #[test]
    fn given_many_events_when_recent_asked_should_keep_only_the_last_ones() {
        let mut t = Trace::new(0);
        for i in 0..100 {
            t.record(fault(i));
        }
        let recent = t.recent();
        assert_eq!(recent.len(), TRACE_EVENTS_MAX);
        assert_eq!(recent.last().map(String::as_str), Some("t99 fault: x"));
        assert_eq!(t.events(), 100);
    }
}
