//! Tasks that do not wake themselves across the runtime's threads.
//!
//! A gateway connection's task polls, in one future, hyper's connection
//! state machine and the channels it fills and drains: the request body the
//! handler reads, and the backend connection a call drives itself
//! ([`crate::backend::conn`]) with the answer's head and body it hands over.
//! Each hand-over wakes the receiving side, whose waker is the very task
//! running it. Tokio takes a task woken during its own poll as one that
//! yielded: it queues it behind the others and wakes a parked worker to take
//! it, so a single call hopped between the runtime's threads two to three
//! times, each hop a futex call and a context switch on both threads (see
//! docs/benchmarks-history.md, "A task no longer wakes itself").
//!
//! [`Inline`] polls its future with a waker of its own ([`InlineWake`]).
//! Woken while that poll runs, the waker only notes it and the poll goes
//! round once more in place; woken at any other time (a socket's readiness,
//! from the runtime's I/O driver; another task), it wakes the task. A poll
//! goes round at most [`ROUNDS`] times, then wakes the task and yields as
//! before, so a future that keeps waking itself cannot hold the thread
//! (Tokio's own yields, `yield_now` and a spent cooperative budget, defer
//! their wake until the worker has run its other tasks, so they still
//! yield).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

/// Nobody is polling: a wake goes to the task.
const IDLE: u8 = 0;
/// A poll runs: a wake is only noted.
const POLLING: u8 = 1;
/// A poll runs and was woken: it goes round once more.
const WOKEN: u8 = 2;

/// Times one poll goes round before it yields to the scheduler instead.
pub const ROUNDS: usize = 8;

/// The waker of one [`Inline`] task's future.
#[derive(Default)]
pub struct InlineWake {
    state: AtomicU8,
    task: AtomicWaker,
}

impl Wake for InlineWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let noted =
            self.state
                .compare_exchange(POLLING, WOKEN, Ordering::AcqRel, Ordering::Acquire);
        match noted {
            Ok(_) | Err(WOKEN) => {}
            // Idle: the poll that would see a note has ended (or one begins
            // now, and the task is polled once more for nothing).
            Err(_) => self.task.wake(),
        }
    }
}

impl InlineWake {
    pub fn new() -> Arc<InlineWake> {
        Arc::new(InlineWake::default())
    }

    /// Polls `f` with this waker on behalf of the task of `cx`, again while
    /// `f` was woken during its own poll (at most [`ROUNDS`] times).
    pub fn poll<T>(
        self: &Arc<Self>,
        cx: &mut Context<'_>,
        mut f: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        self.task.register(cx.waker());
        let waker = Waker::from(Arc::clone(self));
        let mut inner = Context::from_waker(&waker);
        for _ in 0..ROUNDS {
            self.state.store(POLLING, Ordering::Release);
            let polled = f(&mut inner);
            let woken = self
                .state
                .compare_exchange(POLLING, IDLE, Ordering::AcqRel, Ordering::Acquire)
                .is_err();
            if polled.is_ready() {
                self.state.store(IDLE, Ordering::Release);
                return polled;
            }
            if !woken {
                return Poll::Pending;
            }
        }
        // Still woken after every round: yield as a self-woken task does.
        self.state.store(IDLE, Ordering::Release);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// A future polled through an [`InlineWake`]: spawn this instead of the
/// future itself.
pub struct Inline<F> {
    future: Pin<Box<F>>,
    wake: Arc<InlineWake>,
}

/// `future`, polled without waking its own task ([`Inline`]).
pub fn inline<F: Future>(future: F) -> Inline<F> {
    Inline {
        future: Box::pin(future),
        wake: InlineWake::new(),
    }
}

impl<F: Future> Future for Inline<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Inline { future, wake } = self.get_mut();
        wake.poll(cx, |cx| future.as_mut().poll(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A task waker that counts its wakes.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A task to poll on behalf of: its waker, and how often it was woken.
    struct Task {
        count: Arc<Count>,
        waker: Waker,
    }

    impl Task {
        fn new() -> Task {
            let count = Arc::new(Count::default());
            Task {
                waker: Waker::from(Arc::clone(&count)),
                count,
            }
        }

        fn cx(&self) -> Context<'_> {
            Context::from_waker(&self.waker)
        }

        fn wakes(&self) -> usize {
            self.count.0.load(Ordering::SeqCst)
        }
    }

    #[test]
    fn a_wake_during_the_poll_goes_round_again_without_waking_the_task() {
        let task = Task::new();
        let inline = InlineWake::new();
        let mut polls = 0;
        // Ready on the second poll, after waking itself on the first (as a
        // connection that hands the answer to its receiver does).
        let got = inline.poll(&mut task.cx(), |cx| {
            polls += 1;
            if polls == 1 {
                cx.waker().wake_by_ref();
                Poll::Pending
            } else {
                Poll::Ready(7)
            }
        });
        assert_eq!(got, Poll::Ready(7));
        assert_eq!(polls, 2);
        assert_eq!(task.wakes(), 0);
    }

    #[test]
    fn a_wake_after_the_poll_wakes_the_task() {
        let task = Task::new();
        let inline = InlineWake::new();
        let mut kept = None;
        let got: Poll<()> = inline.poll(&mut task.cx(), |cx| {
            kept = Some(cx.waker().clone());
            Poll::Pending
        });
        assert_eq!(got, Poll::Pending);
        assert_eq!(task.wakes(), 0);
        // The socket is ready later, from another thread.
        let kept = kept.expect("the poll kept its waker");
        std::thread::spawn(move || kept.wake())
            .join()
            .expect("woken");
        assert_eq!(task.wakes(), 1);
    }

    #[test]
    fn a_part_that_keeps_waking_itself_yields_after_the_last_round() {
        let task = Task::new();
        let inline = InlineWake::new();
        let mut polls = 0;
        let got: Poll<()> = inline.poll(&mut task.cx(), |cx| {
            polls += 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        });
        assert_eq!(got, Poll::Pending);
        assert_eq!(polls, ROUNDS);
        assert_eq!(task.wakes(), 1);
        // Idle again: a later wake reaches the task.
        Waker::from(Arc::clone(&inline)).wake();
        assert_eq!(task.wakes(), 2);
    }

    #[test]
    fn a_ready_poll_that_was_also_woken_leaves_the_waker_idle() {
        let task = Task::new();
        let inline = InlineWake::new();
        let got = inline.poll(&mut task.cx(), |cx| {
            cx.waker().wake_by_ref();
            Poll::Ready(())
        });
        assert_eq!(got, Poll::Ready(()));
        Waker::from(Arc::clone(&inline)).wake();
        assert_eq!(task.wakes(), 1);
    }

    #[test]
    fn an_inline_future_that_hands_itself_a_value_is_not_woken() {
        // Waits on a channel, then fills it itself, as a connection that
        // reads an answer and hands it to its own receiver.
        async fn hand_over() -> u32 {
            let (tx, mut rx) = tokio::sync::oneshot::channel();
            assert!(futures::poll!(&mut rx).is_pending());
            tx.send(5).expect("sent");
            rx.await.expect("received")
        }
        let plain = Task::new();
        let mut future = std::pin::pin!(hand_over());
        assert_eq!(future.as_mut().poll(&mut plain.cx()), Poll::Ready(5));
        assert_eq!(plain.wakes(), 1, "woken by itself");
        let inlined = Task::new();
        let mut future = std::pin::pin!(inline(hand_over()));
        assert_eq!(future.as_mut().poll(&mut inlined.cx()), Poll::Ready(5));
        assert_eq!(inlined.wakes(), 0);
    }
}
