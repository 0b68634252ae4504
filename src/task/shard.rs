//! Which shard a task belongs to (`election.shards`): a stable hash of its `taskGroup`, or
//! of its key when it has none, modulo the number of shards. A group's tasks share one
//! shard, so that its one-at-a-time rule is one leader's to keep; tasks without a group
//! spread by key.
//!
//! The hash is 64-bit FNV-1a, written here rather than taken from a crate: it must give the
//! same answer on every replica, every platform and every release (std's hasher promises
//! none of that), and it is ten lines. Changing it moves tasks between shards, which is a
//! change of `election.shards` in disguise: the values in the tests below pin it.
//!
//! Pure.

/// One shard of `count`, numbered from 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Shard {
    /// Whether the task at `key` whose group is `group` (empty: none) is this shard's.
    pub fn owns(&self, key: &str, group: &str) -> bool {
        shard_of(key, group, self.count) == self.index
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// The shard, of `count`, of the task at `key` whose group is `group` (empty: none).
pub fn shard_of(key: &str, group: &str, count: u32) -> u32 {
    if count <= 1 {
        return 0;
    }
    let name = if group.is_empty() { key } else { group };
    (fnv1a(name.as_bytes()) % u64::from(count)) as u32
}

/// 64-bit FNV-1a.
fn fnv1a(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(PRIME)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hash is FNV-1a's published values, so a task's shard never changes between
    /// releases.
    #[test]
    fn the_hash_is_fnv1a() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    /// A group decides its tasks' shard whatever their keys; without one, the key does;
    /// one shard owns everything.
    #[test]
    fn a_group_keeps_its_tasks_together() {
        let shard = shard_of("oracleTask/a", "db-7", 6);
        for key in ["oracleTask/b", "oracleTask/c", "oracleTask/x/y"] {
            assert_eq!(shard_of(key, "db-7", 6), shard);
        }
        assert_eq!(shard_of("k", "", 6), shard_of("k", "", 6));
        assert_eq!(shard_of("anything", "g", 1), 0);
        assert_eq!(shard_of("anything", "g", 0), 0);
        let mine = Shard {
            index: shard,
            count: 6,
        };
        assert!(mine.owns("oracleTask/z", "db-7"));
        assert_eq!(mine.to_string(), format!("{shard}/6"));
    }

    /// Keys spread over the shards evenly enough that each leader gets a fair share.
    #[test]
    fn keys_and_groups_spread_over_the_shards() {
        for count in [2u32, 4, 6, 16] {
            let mut seen = vec![0u32; count as usize];
            for n in 0..6000 {
                seen[shard_of(&format!("oracleTask/task_{n}"), "", count) as usize] += 1;
            }
            let fair = 6000 / count;
            for (shard, got) in seen.iter().enumerate() {
                assert!(
                    got.abs_diff(fair) < fair / 5,
                    "{count} shards: shard {shard} got {got}, fair {fair}"
                );
            }
        }
        let groups: std::collections::HashSet<u32> = (0..60)
            .map(|g| shard_of("k", &format!("g{g}"), 6))
            .collect();
        assert_eq!(groups.len(), 6, "60 groups reach every one of 6 shards");
    }
}
