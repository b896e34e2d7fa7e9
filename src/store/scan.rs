//! The blocking export scans both durable stores serve
//! ([`SpanStore::scan`](super::SpanStore::scan) and `scan_ids`), written
//! once over a read connection that knows three queries, and the listing
//! page both build from one extra row.

use std::collections::VecDeque;

use super::{Page, StoreError, Trajectory, TrajectoryFilter, TrajectoryIter, TrajectoryMeta};

/// Trajectory metas fetched per scan round trip.
const SCAN_PAGE: usize = 256;

/// A store's read connection, as the scans use it (blocking).
pub(crate) trait Reader: Send + 'static {
    /// Up to `limit` listing keys matching `filter` after `after` (creation
    /// order; on PostgreSQL, commit order, see `postgres::rows`).
    fn keys(
        &mut self,
        filter: &TrajectoryFilter,
        after: i64,
        limit: usize,
    ) -> Result<Vec<i64>, StoreError>;

    /// One trajectory, read consistently (its meta and calls together), its
    /// calls without their bodies ([`super::Bodies::Skip`]).
    fn by_key(&mut self, key: i64) -> Result<Option<Trajectory>, StoreError>;

    /// [`Reader::by_key`] by trajectory id.
    fn by_id(&mut self, id: &str) -> Result<Option<Trajectory>, StoreError>;
}

/// Matching trajectories in listing-key order, a page of keys at a time.
pub(crate) fn by_filter<R: Reader>(reader: R, filter: &TrajectoryFilter) -> TrajectoryIter {
    Box::new(Scan {
        reader,
        filter: filter.clone(),
        after: 0,
        pending: VecDeque::new(),
        done: false,
    })
}

/// The named trajectories in the order given, skipping unknown ids.
pub(crate) fn by_ids<R: Reader>(mut reader: R, ids: Vec<String>) -> TrajectoryIter {
    Box::new(
        ids.into_iter()
            .filter_map(move |id| reader.by_id(&id).transpose()),
    )
}

/// A listing page out of up to `limit + 1` `(key, meta)` rows: the extra
/// row only says that another page exists.
pub(crate) fn listing_page(mut rows: Vec<(i64, TrajectoryMeta)>, limit: usize) -> Page {
    let more = rows.len() > limit;
    rows.truncate(limit);
    let next_cursor = if more {
        rows.last().map(|(key, _)| key.to_string())
    } else {
        None
    };
    Page {
        items: rows.into_iter().map(|(_, m)| m).collect(),
        next_cursor,
    }
}

struct Scan<R> {
    reader: R,
    filter: TrajectoryFilter,
    after: i64,
    pending: VecDeque<i64>,
    done: bool,
}

impl<R: Reader> Iterator for Scan<R> {
    type Item = Result<Trajectory, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.done {
                return None;
            }
            if self.pending.is_empty() {
                match self.reader.keys(&self.filter, self.after, SCAN_PAGE) {
                    Ok(keys) if keys.is_empty() => {
                        self.done = true;
                        return None;
                    }
                    Ok(keys) => self.pending.extend(keys),
                    Err(e) => {
                        self.done = true;
                        return Some(Err(e));
                    }
                }
            }
            let key = self.pending.pop_front()?;
            self.after = key;
            match self.reader.by_key(key) {
                Ok(Some(t)) => return Some(Ok(t)),
                Ok(None) => continue,
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}
