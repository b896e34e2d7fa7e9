//! Builders shared by the store and export tests.
#![allow(dead_code)]

use serde_json::json;
use tito::store::{CallImage, CallRecord, StoredImage};

/// A call with deterministic logprobs (`-(k+1)/100` for the k-th sampled id).
pub fn call(
    traj: &str,
    index: u32,
    sample: u32,
    parent: Option<u32>,
    delta: Vec<u32>,
    sampled: Vec<u32>,
) -> CallRecord {
    let logprobs = (0..sampled.len())
        .map(|k| Some(-((k + 1) as f32) / 100.0))
        .collect();
    CallRecord {
        trajectory_id: traj.to_string(),
        call_index: index,
        sample_index: sample,
        parent_call: parent,
        backend: "http://127.0.0.1:8001".into(),
        started_at: 1_700_000_000_000 + i64::from(index),
        finished_at: 1_700_000_000_500 + i64::from(index),
        prompt_delta_ids: delta,
        sampled_ids: sampled,
        logprobs,
        finish_reason: "stop".into(),
        request: json!({"messages": [{"role": "user", "content": format!("turn {index}")}], "temperature": 1.0}).into(),
        response: json!({"role": "assistant", "content": "ok"}).into(),
        drift: None,
        parse_outcome: Some("ok".into()),
        moved_from: None,
        weight_version: Some(format!("step-{index}")),
        tokenizer_sha256: "tok-sha".into(),
        template_sha256: "tpl-sha".into(),
        reward: None,
        truncated: false,
        normalized: Vec::new(),
        request_of: None,
        api: None,
        response_id: None,
        versions: Vec::new(),
        images: Vec::new(),
        model: None,
        adapter: None,
    }
}

/// An image of `len` deterministic bytes (a PNG signature, then bytes
/// drawn from `seed`), keyed by their SHA-256. The store keeps bytes
/// without decoding them.
pub fn image(seed: u64, len: usize) -> StoredImage {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while bytes.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        bytes.push(x as u8);
    }
    let side = 8 + (seed % 8) as u32;
    let image = StoredImage::new("image/png", side, side + 1, bytes);
    assert_eq!(image.sha256, sha256_hex(&image.bytes));
    image
}

/// A call's reference to `image`, with a `(t, h, w)` grid.
pub fn image_ref(image: &StoredImage) -> CallImage {
    CallImage {
        sha256: image.sha256.clone(),
        mime: image.mime.clone(),
        width: image.width,
        height: image.height,
        grid_thw: [1, 2 * image.height, 2 * image.width],
        offset: 0,
        tokens: 1,
    }
}

/// Lowercase hex SHA-256, computed here rather than by the store.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

/// Ids `base..base+n`.
pub fn ids(base: u32, n: u32) -> Vec<u32> {
    (base..base + n).collect()
}

/// A branching trajectory:
/// sample 0: c0 (root) -> c1 -> c2
/// sample 1: c0 -> c1 -> c3 (branches from c1) -> c4
/// sample 2: c5 (a fresh root, e.g. the client edited history)
pub fn branching(traj: &str) -> Vec<CallRecord> {
    vec![
        call(traj, 0, 0, None, ids(100, 5), ids(200, 3)),
        call(traj, 1, 0, Some(0), ids(300, 2), ids(400, 4)),
        call(traj, 2, 0, Some(1), ids(500, 2), ids(600, 2)),
        call(traj, 3, 1, Some(1), ids(700, 3), ids(800, 5)),
        call(traj, 4, 1, Some(3), ids(900, 1), ids(1000, 2)),
        call(traj, 5, 2, None, ids(1100, 6), ids(1200, 3)),
    ]
}

/// [`branching`] with some logprobs missing, as from a backend that reported
/// none for those tokens: call 0 lacks its second, call 1 all four, call 3
/// its first and third, call 5 its last. Real values include 0.0 and f32::MIN.
pub fn with_missing_logprobs(traj: &str) -> Vec<CallRecord> {
    let mut calls = branching(traj);
    calls[0].logprobs = vec![Some(-0.25), None, Some(0.0)];
    calls[1].logprobs = vec![None; 4];
    calls[3].logprobs = vec![None, Some(-1e-30), None, Some(f32::MIN), Some(-7.5)];
    calls[5].logprobs = vec![Some(-3.5), Some(-0.5), None];
    calls
}

/// `calls` with every logprob missing.
pub fn without_logprobs(mut calls: Vec<CallRecord>) -> Vec<CallRecord> {
    for c in &mut calls {
        c.logprobs = vec![None; c.sampled_ids.len()];
    }
    calls
}

/// A fresh, empty database on the throwaway PostgreSQL cluster that
/// `scripts/test.sh` starts (`TITO_TEST_POSTGRES`, the cluster's base URL
/// without a database); one per call, so tests never share rows.
pub fn postgres_url() -> String {
    let base = std::env::var("TITO_TEST_POSTGRES").unwrap_or_else(|_| {
        panic!(
            "TITO_TEST_POSTGRES is unset: run the tests with scripts/test.sh, or start a cluster \
             with `export TITO_TEST_POSTGRES=$(scripts/postgres.sh start /tmp/tito-pg)`"
        )
    });
    postgres_database(&base)
}

/// A plain session on the database at `url` (another replica, or an
/// administrator), its connection driven on the current runtime.
pub async fn pg_session(url: &str) -> tokio_postgres::Client {
    match tokio_postgres::connect(url, tokio_postgres::NoTls).await {
        Ok((client, conn)) => {
            tokio::spawn(conn);
            client
        }
        Err(e) => panic!("cannot connect to {url}: {e}"),
    }
}

/// Creates a database with a random name on the cluster at `base` (a URL
/// without a database) and returns its URL. Also used by the benches.
pub fn postgres_database(base: &str) -> String {
    let name = format!("tito_{:016x}", rand::random::<u64>());
    let admin = format!("{base}/postgres");
    let sql = format!("CREATE DATABASE {name}");
    // The driver needs a runtime of its own: the caller may be inside one.
    let created = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            client.batch_execute(&sql).await.map_err(|e| e.to_string())
        })
    })
    .join();
    match created {
        Ok(Ok(())) => format!("{base}/{name}"),
        Ok(Err(e)) => panic!("cannot create a database on {base}: {e}"),
        Err(_) => panic!("database creation thread panicked"),
    }
}
