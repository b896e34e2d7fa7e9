//! Where a chat request's time goes, phase by phase (`scripts/bench-phases.sh`).
//!
//! With the cargo feature `phase-timing` (off by default), every request
//! through `api::around` carries a row of [`Mark`] times in a task-local;
//! code on the request's path calls [`mark`] as it passes each moment. Every
//! [`WINDOW`] requests, the median of each phase (the time from one mark to
//! the next one the request passed) and of the whole request are appended to
//! the file named by `TITO_PHASES_FILE`. Work done outside the request's
//! task (a commit made on the writer thread, a call finished after its
//! client left) is not marked. Without the feature, [`mark`] is empty and
//! [`timed`] returns its future unchanged.

/// The moments marked, in the order a non-streamed chat request passes
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// `around` starts.
    Begin,
    /// The request span exists.
    Span,
    /// The chat handler starts (routing and extractors done).
    Handler,
    /// Body parsed and checked.
    Parsed,
    /// Retry lookup done, trajectory named.
    Claimed,
    /// The chat template starts rendering.
    RenderStart,
    /// The prompt is text.
    Rendered,
    /// The prompt text is token ids.
    Encoded,
    /// The call is planned.
    Planned,
    /// A backend is chosen; the request goes out.
    Routed,
    /// The backend's answer head arrived.
    Answered,
    /// The first event is decoded and the call is running.
    Started,
    /// The last backend event is assembled.
    LastEvent,
    /// The commit starts (the call's record is built next).
    CommitStart,
    /// The store's writing connection is held.
    StoreLocked,
    /// The rows are written; `COMMIT` is next.
    Applied,
    /// `COMMIT` returned.
    Committed,
    /// The trajectory's view has the call.
    Recorded,
    /// The handler has the recorded answer.
    Finished,
    /// The response is built.
    Built,
    /// `around` ends.
    End,
}

/// How many marks there are.
pub const MARKS: usize = Mark::End as usize + 1;

/// Requests per reported window.
pub const WINDOW: usize = 4000;

#[cfg(feature = "phase-timing")]
mod on {
    use std::cell::RefCell;
    use std::future::Future;
    use std::io::Write;
    use std::sync::Mutex;
    use std::time::Instant;

    use super::{Mark, MARKS, WINDOW};

    tokio::task_local! {
        static ROW: RefCell<[Option<Instant>; MARKS]>;
    }

    /// Rows of finished requests: each mark's time since `Begin`, in ns.
    static DONE: Mutex<Vec<[Option<u64>; MARKS]>> = Mutex::new(Vec::new());

    pub fn mark(m: Mark) {
        let _ = ROW.try_with(|r| r.borrow_mut()[m as usize] = Some(Instant::now()));
    }

    pub async fn timed<F: Future>(f: F) -> F::Output {
        ROW.scope(RefCell::new([None; MARKS]), async {
            mark(Mark::Begin);
            let out = f.await;
            mark(Mark::End);
            if let Ok(row) = ROW.try_with(|r| *r.borrow()) {
                keep(row);
            }
            out
        })
        .await
    }

    fn keep(row: [Option<Instant>; MARKS]) {
        let Some(begin) = row[0] else { return };
        let row = row.map(|t| t.map(|t| t.duration_since(begin).as_nanos() as u64));
        let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
        done.push(row);
        if done.len() >= WINDOW {
            let report = super::report(&done);
            done.clear();
            drop(done);
            if let Some(path) = std::env::var_os("TITO_PHASES_FILE") {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path);
                if let Ok(mut f) = file {
                    let _ = f.write_all(report.as_bytes());
                }
            }
        }
    }
}

#[cfg(feature = "phase-timing")]
pub use on::{mark, timed};

/// Marks `m` on the current request (nothing without `phase-timing`).
#[cfg(not(feature = "phase-timing"))]
#[inline(always)]
pub fn mark(_: Mark) {}

/// Runs `f` as one timed request (itself without `phase-timing`).
#[cfg(not(feature = "phase-timing"))]
#[inline(always)]
pub fn timed<F: std::future::Future>(f: F) -> F {
    f
}

/// Every mark, in order.
pub const ALL: [Mark; MARKS] = [
    Mark::Begin,
    Mark::Span,
    Mark::Handler,
    Mark::Parsed,
    Mark::Claimed,
    Mark::RenderStart,
    Mark::Rendered,
    Mark::Encoded,
    Mark::Planned,
    Mark::Routed,
    Mark::Answered,
    Mark::Started,
    Mark::LastEvent,
    Mark::CommitStart,
    Mark::StoreLocked,
    Mark::Applied,
    Mark::Committed,
    Mark::Recorded,
    Mark::Finished,
    Mark::Built,
    Mark::End,
];

/// One window's table: for each mark a request passed, the median time
/// from the previous mark it passed, in µs, and how many requests passed
/// it; then the median whole request.
pub fn report(rows: &[[Option<u64>; MARKS]]) -> String {
    let mut out = format!("window of {} requests (median µs)\n", rows.len());
    // One line: the median of `ns` in µs and how many there are.
    let mut line = |name: &str, mut ns: Vec<u64>| {
        if ns.is_empty() {
            return;
        }
        ns.sort_unstable();
        let median = ns[ns.len() / 2] as f64 / 1e3;
        out.push_str(&format!("{name:>14} {median:8.1} {:>7}\n", ns.len()));
    };
    for (i, m) in ALL.iter().enumerate().skip(1) {
        let gaps = rows
            .iter()
            .filter_map(|r| {
                let at = r[i]?;
                let before = r[..i].iter().rev().find_map(|t| *t)?;
                Some(at.saturating_sub(before))
            })
            .collect();
        line(&format!("{m:?}"), gaps);
    }
    line("whole", rows.iter().filter_map(|r| r[MARKS - 1]).collect());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mark_is_listed_once_in_order() {
        for (i, m) in ALL.iter().enumerate() {
            assert_eq!(*m as usize, i, "{m:?}");
        }
    }

    #[test]
    fn a_phase_runs_from_the_last_mark_passed() {
        let mut a = [None; MARKS];
        a[0] = Some(0);
        a[Mark::Handler as usize] = Some(10_000);
        a[Mark::Parsed as usize] = Some(13_000);
        a[MARKS - 1] = Some(20_000);
        let report = report(&[a]);
        // Span was not passed: Handler counts from Begin.
        assert!(!report.contains("Span"), "{report}");
        assert!(
            report.contains("       Handler     10.0       1"),
            "{report}"
        );
        assert!(
            report.contains("        Parsed      3.0       1"),
            "{report}"
        );
        assert!(
            report.contains("           End      7.0       1"),
            "{report}"
        );
        assert!(
            report.contains("         whole     20.0       1"),
            "{report}"
        );
    }
}
