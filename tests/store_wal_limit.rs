//! `[store] wal_max_bytes`: past it, a SQLite commit waits for a
//! checkpoint that copies the whole write-ahead log, which then starts
//! over, so the `-wal` file grows to about the limit and no further. The key
//! is parsed strictly.

mod store_support;

use std::path::Path;

use store_support::{call, ids};
use tito::store::{DynStore, StoreOptions};

const MIB: u64 = 1 << 20;

fn config(extra: &str) -> Result<tito::Config, String> {
    let text = format!(
        "[model]\nname = \"m\"\ntokenizer = \"unused\"\n\
         [[backends]]\nurl = \"http://127.0.0.1:1\"\nkind = \"vllm\"\n{extra}"
    );
    tito::Config::from_toml(&text).map_err(|e| e.to_string())
}

fn wal_bytes(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("spans.db-wal"))
        .map(|m| m.len())
        .unwrap_or(0)
}

/// Call `i` of a chain: some 4 WAL frames of token ids and logprobs.
async fn append(store: &DynStore, i: u32) {
    let c = call(
        "t",
        i,
        0,
        i.checked_sub(1),
        ids(i * 10, 2000),
        ids(i * 10 + 5000, 1000),
    );
    store.append_call(c).await.expect("append");
}

fn open(dir: &Path, wal_max: &str) -> DynStore {
    let url = format!("sqlite://{}/spans.db", dir.display());
    let c = config(&format!("[store]\nurl = \"{url}\"\n{wal_max}")).expect("valid");
    tito::store::open_with_options(&url, &StoreOptions::from(&c.store)).expect("open")
}

#[tokio::test]
async fn the_wal_grows_to_its_limit_and_no_further() {
    // With the default limit (64 MiB) and fewer frames than one checkpoint
    // interval (1,000), nothing copies the WAL: it holds every commit.
    let roomy = tempfile::tempdir().expect("tempdir");
    let store = open(roomy.path(), "");
    let mut calls = 0;
    while wal_bytes(roomy.path()) < 3 * MIB {
        append(&store, calls).await;
        calls += 1;
        assert!(calls < 10_000, "the WAL does not grow");
    }
    let roomy_wal = wal_bytes(roomy.path());
    drop(store);

    // The same calls with a limit of 1 MiB: the commit that crosses it
    // waits for the WAL to be copied, and the next commit starts it over.
    let tight = tempfile::tempdir().expect("tempdir");
    let store = open(tight.path(), "wal_max_bytes = 1048576\n");
    for i in 0..calls {
        append(&store, i).await;
    }
    let wal = wal_bytes(tight.path());
    eprintln!(
        "{calls} calls: a WAL of {roomy_wal} bytes by default, {wal} with wal_max_bytes = 1 MiB"
    );
    // The limit, and the frames of the one call that crossed it.
    assert!(
        wal <= MIB + 64 * 1024,
        "a WAL of {wal} bytes with wal_max_bytes = 1 MiB after {calls} calls"
    );
    let t = store.get_trajectory("t").await.expect("read").expect("t");
    assert_eq!(t.calls.len() as u32, calls);
}

#[test]
fn wal_max_bytes_is_parsed_strictly() {
    let c = config("").expect("valid");
    assert_eq!(c.store.wal_max_bytes, 64 * MIB);
    let c = config("[store]\nwal_max_bytes = 1048576\n").expect("valid");
    assert_eq!(c.store.wal_max_bytes, MIB);
    for bad in ["1048575", "0", "-1", "\"64MiB\""] {
        let err = config(&format!("[store]\nwal_max_bytes = {bad}\n")).expect_err(bad);
        assert!(err.contains("wal_max_bytes"), "{bad}: {err}");
    }
    let err = config("[store]\nwal_max_byte = 1048576\n").expect_err("unknown key");
    assert!(err.contains("wal_max_byte"), "{err}");
}
