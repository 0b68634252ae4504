//! User events as one Consul agent keeps them: the last `EVENT_BUFFER` events this agent
//! received, oldest first, in memory only (gone after a restart, as on an agent), and a
//! signal for blocked `/v1/event/list` reads. Gossip is the delivery in Consul; on this
//! single agent an event fired here is received here, if its filters select this agent.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::watch;

/// Consul's agent keeps this many recent events (agent.go `eventBuf`).
pub const EVENT_BUFFER: usize = 256;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserEvent {
    pub id: String,
    pub name: String,
    /// `None` when the fire had no body.
    pub payload: Option<Vec<u8>>,
    pub node_filter: String,
    pub service_filter: String,
    pub tag_filter: String,
    /// Serf's Lamport time for user events; the first event gets 1.
    pub ltime: u64,
}

pub struct Events {
    ring: Mutex<Ring>,
    /// Bumped on every event kept; blocked lists wait on it.
    added: watch::Sender<u64>,
}

#[derive(Default)]
struct Ring {
    events: VecDeque<UserEvent>,
    clock: u64,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            ring: Mutex::new(Ring::default()),
            added: watch::channel(0).0,
        }
    }
}

impl Events {
    /// Keeps a received event with the next Lamport time, dropping the oldest past the
    /// buffer's size.
    pub fn add(&self, mut event: UserEvent) {
        let mut ring = self.ring.lock().expect("event ring lock");
        ring.clock += 1;
        event.ltime = ring.clock;
        if ring.events.len() == EVENT_BUFFER {
            ring.events.pop_front();
        }
        ring.events.push_back(event);
        drop(ring);
        self.added.send_modify(|n| *n += 1);
    }

    /// The events kept, oldest first.
    pub fn list(&self) -> Vec<UserEvent> {
        let ring = self.ring.lock().expect("event ring lock");
        ring.events.iter().cloned().collect()
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.added.subscribe()
    }
}

/// Consul's `uuidToUint64`: the event list's index is the XOR of the halves of the last
/// event's id, so it changes with every event but does not grow.
pub fn uuid_to_u64(uuid: &str) -> u64 {
    let hex: String = uuid.chars().filter(|c| *c != '-').collect();
    let half = |range: std::ops::Range<usize>| {
        hex.get(range)
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .unwrap_or(0)
    };
    half(0..16) ^ half(16..32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(name: &str) -> UserEvent {
        UserEvent {
            id: uuid::Uuid::new_v4().to_string(),
            name: name.into(),
            payload: None,
            node_filter: String::new(),
            service_filter: String::new(),
            tag_filter: String::new(),
            ltime: 0,
        }
    }

    /// The ring keeps the newest 256 events in order, with rising Lamport times.
    #[test]
    fn the_ring_keeps_the_newest_events_in_order() {
        let events = Events::default();
        for n in 0..EVENT_BUFFER + 3 {
            events.add(event(&n.to_string()));
        }
        let kept = events.list();
        assert_eq!(kept.len(), EVENT_BUFFER);
        assert_eq!(kept[0].name, "3");
        assert_eq!(kept[0].ltime, 4);
        assert_eq!(kept.last().unwrap().ltime, EVENT_BUFFER as u64 + 3);
    }

    /// Consul's formula: the first 16 hex digits XOR the last 16.
    #[test]
    fn uuid_index_is_consuls() {
        assert_eq!(uuid_to_u64("00000000-0000-0001-0000-000000000003"), 1 ^ 3);
        assert_eq!(
            uuid_to_u64("ffffffff-ffff-ffff-0000-000000000000"),
            u64::MAX
        );
    }
}
