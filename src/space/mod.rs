//! Space: keeping etcd out of NOSPACE. etcd refuses every write once its database file reaches
//! `--quota-backend-bytes` (the NOSPACE alarm) until someone compacts, defragments and disarms.
//! The warden sees the sizes ([`Sample`], taken by the health loop), how fast the file grows
//! ([`Forecast`]) and, as the writer, the newest revision its backups hold, so it can repair
//! NOSPACE by itself without losing a write (the writer's part is `backup`'s
//! `keep_space`): compact to that revision, defragment one member at a time (the leader last,
//! after moving leadership away), disarm, and say what it did, or say plainly that the data
//! itself is too large for the quota.

pub mod keeper;

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

/// etcd's default `--quota-backend-bytes` (2 GiB) when the flag is absent or 0.
pub const DEFAULT_QUOTA: i64 = 2 << 30;

/// After compaction and defragmentation, data still using this share of the quota is too large:
/// disarming would only see the alarm raised again after a few more writes, and the repair loop
/// again. The alarm then stays (etcd's own protection) and the warden says what to do.
pub const TOO_LARGE: f64 = 0.75;

/// One look at a member's space, from its status answer and alarm list.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Sample {
    /// The database file's size (what the quota is compared with).
    pub db_size: i64,
    /// The part of it in use; the rest is free pages only a defragmentation returns.
    pub db_size_in_use: i64,
    /// The quota: etcd's own word (3.6 and later), else the command line's, else etcd's default.
    pub quota: i64,
    /// A NOSPACE alarm is raised on some member.
    pub nospace: bool,
    /// Bytes per second the file grew by, over the last minutes (`None` until two samples).
    pub growth_bytes_per_second: Option<f64>,
    /// At that rate, seconds until the file reaches the quota (`None`: not growing).
    pub seconds_to_nospace: Option<f64>,
}

/// The options of `run` for space (`--space-keeper`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// Repair NOSPACE (and defragment when it pays).
    pub enabled: bool,
    /// Defragment when free pages exceed this share of the file...
    pub defrag_ratio: f64,
    /// ...and at least this many bytes.
    pub defrag_min_bytes: i64,
    /// `--space-history`: the writer compacts what is older than this, never past the revision
    /// the store holds (`None`: the warden compacts only to repair NOSPACE).
    pub history: Option<Duration>,
    /// `--space-defrag-not-ready`: a member is not ready while it defragments (by default its
    /// last verdict is held: the pause is the defragmentation's, not a failure).
    pub defrag_not_ready: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            enabled: true,
            defrag_ratio: 0.5,
            defrag_min_bytes: 64 << 20,
            history: None,
            defrag_not_ready: false,
        }
    }
}

/// A forecast of NOSPACE within this many seconds makes any worthwhile amount of free pages
/// (`defrag_min_bytes`) worth a defragmentation, whatever their share of the file.
pub const FORECAST_SHORT: f64 = 3600.0;

impl Config {
    /// Why defragmenting a member with `sample` frees enough to be worth a blocked member, if it
    /// does: free pages above both thresholds, or NOSPACE forecast within the hour.
    pub fn defrag_pays(&self, sample: &Sample) -> Option<&'static str> {
        let free = sample.db_size - sample.db_size_in_use;
        if free < self.defrag_min_bytes {
            return None;
        }
        if free as f64 >= self.defrag_ratio * sample.db_size as f64 {
            return Some("free pages make a defragmentation pay");
        }
        sample
            .seconds_to_nospace
            .is_some_and(|s| s < FORECAST_SHORT)
            .then_some("NOSPACE is forecast within the hour: defragmenting to return the free pages")
    }
}

/// The history window (`--space-history`): which revision the writer may compact to. It notes the
/// revision the store held at each look and compacts to the newest one noted at least a window
/// ago, so a compaction never passes what the delta chain holds and every revision of the last
/// window stays readable.
#[derive(Debug, Default)]
pub struct History {
    marks: VecDeque<(Instant, i64)>,
    compacted: i64,
}

impl History {
    /// Notes `backed_up` at `now`; the revision to compact to now, if any beyond the last one.
    pub fn target(&mut self, now: Instant, backed_up: i64, window: Duration) -> Option<i64> {
        if self.marks.back().is_none_or(|(_, r)| *r < backed_up) {
            self.marks.push_back((now, backed_up));
        }
        let mut target = None;
        while let Some((t, r)) = self.marks.front().copied()
            && now.duration_since(t) >= window
        {
            target = Some(r);
            self.marks.pop_front();
        }
        target.filter(|r| *r > self.compacted)
    }

    /// etcd compacted to `revision` (this writer, or someone else already beyond it).
    pub fn compacted(&mut self, revision: i64) {
        self.compacted = self.compacted.max(revision);
    }

    /// How often to look: a tenth of the window, between 10 ms and a minute.
    pub fn every(window: Duration) -> Duration {
        (window / 10).clamp(Duration::from_millis(10), Duration::from_secs(60))
    }
}

/// etcd is defragmenting the data dir right now: its temporary copy (`member/snap/db.tmp*`, the
/// same name in every release from 3.4 on) exists and is being written. A member defragmented by
/// another member's warden, or by an operator's `etcdctl defrag`, shows it too. A copy left by a
/// crash is removed by etcd's next start; one older than a minute is not taken for a defrag.
pub fn defrag_in_progress(data_dir: &std::path::Path) -> bool {
    let Ok(entries) = std::fs::read_dir(data_dir.join("member/snap")) else {
        return false;
    };
    entries.flatten().any(|e| {
        e.file_name().to_string_lossy().starts_with("db.tmp")
            && e.metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|m| m.elapsed().ok())
                .is_some_and(|age| age < Duration::from_secs(60))
    })
}

/// The growth rate of the database file over a sliding window of samples.
#[derive(Debug, Default)]
pub struct Forecast {
    samples: VecDeque<(Instant, i64)>,
}

/// How far back the rate looks.
const WINDOW: Duration = Duration::from_secs(600);

impl Forecast {
    /// Adds a sample and fills in `growth_bytes_per_second` and `seconds_to_nospace`.
    pub fn observe(&mut self, at: Instant, sample: &mut Sample) {
        // A defragmentation shrinks the file: the rate starts over from there.
        if self.samples.back().is_some_and(|(_, s)| *s > sample.db_size) {
            self.samples.clear();
        }
        self.samples.push_back((at, sample.db_size));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| at.duration_since(*t) > WINDOW)
        {
            self.samples.pop_front();
        }
        let (t0, s0) = *self.samples.front().expect("just pushed");
        let span = at.duration_since(t0).as_secs_f64();
        sample.growth_bytes_per_second = (span >= 1.0).then(|| (sample.db_size - s0) as f64 / span);
        sample.seconds_to_nospace = match sample.growth_bytes_per_second {
            _ if sample.db_size >= sample.quota => Some(0.0),
            Some(rate) if rate > 0.0 => Some((sample.quota - sample.db_size) as f64 / rate),
            _ => None,
        };
    }
}

/// What one NOSPACE repair did, for /status and the log.
#[derive(Debug, Clone, Serialize)]
pub struct Repair {
    #[serde(with = "crate::telemetry::opt_unix_seconds")]
    pub at: Option<SystemTime>,
    /// The revision compacted to: the newest the backups held.
    pub compacted_to: Option<i64>,
    pub db_size_before: i64,
    pub db_size_after: i64,
    pub db_size_in_use_after: i64,
    pub quota: i64,
    pub seconds: f64,
    /// Disarmed and writable again (`false`: see `problem`).
    pub disarmed: bool,
    pub problem: Option<String>,
}

/// The verdict after compaction and defragmentation: `Err` when the data itself is too large.
pub fn after_repair(in_use: i64, quota: i64, compacted_to: Option<i64>) -> Result<(), String> {
    if in_use as f64 >= TOO_LARGE * quota as f64 {
        return Err(format!(
            "the data itself is too large for the quota: after compaction{} and defragmentation etcd holds {} MiB in use of its \
             --quota-backend-bytes {} MiB; the NOSPACE alarm stays raised. Delete data, or raise --quota-backend-bytes (etcd's \
             suggested maximum is 8 GiB) and restart",
            compacted_to
                .map(|r| format!(" to revision {r}"))
                .unwrap_or_default(),
            in_use >> 20,
            quota >> 20
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(db: i64) -> Sample {
        Sample {
            db_size: db,
            db_size_in_use: db,
            quota: 1000,
            ..Sample::default()
        }
    }

    #[test]
    fn the_forecast_is_the_growth_over_the_window_and_restarts_after_a_shrink() {
        let mut f = Forecast::default();
        let t = Instant::now();
        let mut s = sample(100);
        f.observe(t, &mut s);
        assert_eq!(s.growth_bytes_per_second, None);
        let mut s = sample(200);
        f.observe(t + Duration::from_secs(10), &mut s);
        assert_eq!(s.growth_bytes_per_second, Some(10.0));
        assert_eq!(s.seconds_to_nospace, Some(80.0));
        // Defragmented: smaller, no rate yet.
        let mut s = sample(50);
        f.observe(t + Duration::from_secs(20), &mut s);
        assert_eq!(s.growth_bytes_per_second, None);
        assert_eq!(s.seconds_to_nospace, None);
        let mut s = sample(1000);
        f.observe(t + Duration::from_secs(30), &mut s);
        assert_eq!(s.seconds_to_nospace, Some(0.0));
    }

    #[test]
    fn defragmentation_pays_only_for_enough_free_pages() {
        let c = Config {
            defrag_min_bytes: 100,
            ..Config::default()
        };
        let s = |db, used| Sample {
            db_size: db,
            db_size_in_use: used,
            ..Sample::default()
        };
        assert!(c.defrag_pays(&s(1000, 400)).is_some());
        assert!(c.defrag_pays(&s(1000, 600)).is_none());
        assert!(c.defrag_pays(&s(150, 60)).is_none());
        // The same free pages with NOSPACE forecast within the hour: worth it.
        let soon = Sample {
            seconds_to_nospace: Some(1800.0),
            ..s(1000, 600)
        };
        assert!(c.defrag_pays(&soon).unwrap().contains("forecast"));
        let later = Sample {
            seconds_to_nospace: Some(7200.0),
            ..s(1000, 600)
        };
        assert!(c.defrag_pays(&later).is_none());
    }

    #[test]
    fn the_history_window_compacts_to_what_the_store_held_a_window_ago() {
        let mut h = History::default();
        let t = Instant::now();
        let w = Duration::from_secs(10);
        assert_eq!(h.target(t, 100, w), None);
        assert_eq!(h.target(t + Duration::from_secs(5), 150, w), None);
        // 10 s on: what the store held 10 s ago, not what it holds now.
        assert_eq!(h.target(t + Duration::from_secs(10), 200, w), Some(100));
        h.compacted(100);
        assert_eq!(h.target(t + Duration::from_secs(12), 200, w), None);
        assert_eq!(h.target(t + Duration::from_secs(16), 250, w), Some(150));
        // Someone compacted further: nothing to do until the marks pass it.
        h.compacted(220);
        assert_eq!(h.target(t + Duration::from_secs(21), 260, w), None);
        assert_eq!(h.target(t + Duration::from_secs(31), 300, w), Some(260));
        assert_eq!(History::every(Duration::from_secs(300)), Duration::from_secs(30));
        assert_eq!(
            History::every(Duration::from_millis(50)),
            Duration::from_millis(10)
        );
    }

    #[test]
    fn data_that_fills_the_quota_after_compaction_is_too_large() {
        assert!(
            after_repair(760, 1000, Some(7))
                .unwrap_err()
                .contains("revision 7")
        );
        assert!(after_repair(300, 1000, Some(7)).is_ok());
    }
}
