//! `tito engine`'s stream plumbing: in-stream errors and client exits.

use super::stream_error;
use crate::backend::pump::EventDecoder;
use crate::backend::vllm::VllmDecoder;
use crate::backend::BackendError;

/// A client that leaves before the first event cancels the generation
/// at once: the feeding task (holding the engine's stream) is dropped
/// when the response is, not at its next send.
#[tokio::test]
async fn a_response_dropped_before_its_first_event_drops_the_generation() {
    struct Generation(Option<tokio::sync::oneshot::Sender<()>>);
    impl Drop for Generation {
        fn drop(&mut self) {
            if let Some(tx) = self.0.take() {
                let _ = tx.send(());
            }
        }
    }
    let (dropped_tx, dropped) = tokio::sync::oneshot::channel();
    let generation = Generation(Some(dropped_tx));
    let response = super::sse(move |_tx| async move {
        let _held = generation;
        // Queued, or prefilling: no event for a long time.
        std::future::pending::<()>().await;
    });
    drop(response);
    // A bound for a broken build only; a passing run returns at once.
    let failsafe = std::time::Duration::from_secs(20);
    let dropped = tokio::time::timeout(failsafe, dropped).await;
    assert!(
        matches!(dropped, Ok(Ok(()))),
        "the generation is still held"
    );
}

/// The gateway reads an engine's in-stream error as the error it was: a
/// refused request stays a refusal (not retried elsewhere), a failed
/// engine a 5xx (counted against its health), not an unreadable answer.
#[test]
fn in_stream_errors_keep_their_status_through_the_gateway_s_decoder() {
    let refused = BackendError::Rejected {
        backend: "engine".into(),
        message: "the output constraint allows no next token".into(),
    };
    let failed = BackendError::Status {
        backend: "engine".into(),
        status: 500,
        message: "llama_decode failed".into(),
    };
    let mut decoder = VllmDecoder::new("tito-engine", None);
    let read = |decoder: &mut VllmDecoder, e| decoder.on_data(&stream_error(e).to_string());
    match read(&mut decoder, refused) {
        Err(BackendError::Rejected { message, .. }) => {
            assert!(message.contains("no next token"), "{message}")
        }
        other => panic!("a refusal: {other:?}"),
    }
    match read(&mut decoder, failed) {
        // The engine answers a failed decode 502, as the gateway does.
        Err(e @ BackendError::Status { status: 502, .. }) => assert!(e.counts_against_health()),
        other => panic!("a failed engine: {other:?}"),
    }
}
