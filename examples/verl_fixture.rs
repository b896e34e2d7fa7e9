//! Writes a verl-layout Parquet file from a throwaway SQLite store holding
//! synthetic multi-turn trajectories, for tests/python/test_parquet_verl.py.
//!
//! `cargo run --example verl_fixture -- OUT.parquet PROMPT_LENGTH RESPONSE_LENGTH`
//! prints the export stats as one JSON line on stdout.

use serde_json::json;
use tito::export::{ExportOptions, Format, Layout};
use tito::store::{CallRecord, TrajectoryFilter, TrajectoryMetadata};

/// Calls after the third ran under newer weights.
fn call(traj: &str, i: u32, parent: Option<u32>, delta: Vec<u32>, sampled: Vec<u32>) -> CallRecord {
    CallRecord {
        trajectory_id: traj.into(),
        call_index: i,
        sample_index: 0,
        parent_call: parent,
        backend: "fixture".into(),
        started_at: 0,
        finished_at: 0,
        logprobs: sampled
            .iter()
            .map(|x| (x % 11 != 0).then(|| -((x % 7) as f32) / 10.0 - 0.01))
            .collect(),
        prompt_delta_ids: delta,
        sampled_ids: sampled,
        finish_reason: "stop".into(),
        request: json!({}).into(),
        response: json!({}).into(),
        drift: None,
        parse_outcome: None,
        moved_from: None,
        weight_version: Some(if i < 3 { "step-1" } else { "step-2" }.into()),
        tokenizer_sha256: "t".into(),
        template_sha256: "p".into(),
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (out, p, r) = match args.as_slice() {
        [_, out, p, r] => (out.clone(), p.parse::<usize>()?, r.parse::<usize>()?),
        _ => anyhow::bail!("usage: verl_fixture OUT.parquet PROMPT_LENGTH RESPONSE_LENGTH"),
    };
    let dir = tempfile::tempdir()?;
    let store = tito::store::open(&format!("sqlite://{}/spans.db", dir.path().display()))?;
    // Trajectory k: a prompt of 10 + 3k ids, then k + 1 turns of 12 sampled
    // ids and 5 observation ids. Long k overflow the response length, and
    // the prompt of the last one is longer than any sane prompt_length.
    // Groups of 4 (`task-0` ...), with dataset fields and reward parts.
    for k in 0..12u32 {
        let id = format!("t-{k}");
        let task = TrajectoryMetadata {
            group: Some(format!("task-{}", k / 4)),
            data_source: Some("fixture".into()),
            index: Some(i64::from(k)),
            extra_info: Some(json!({"k": k})),
        };
        store.set_metadata(&id, &task).await?;
        let prompt_len = if k == 11 { 10_000 } else { 10 + 3 * k };
        let mut next = 1000 * k + 1;
        let mut ids = |n: u32| -> Vec<u32> {
            let v: Vec<u32> = (next..next + n).collect();
            next += n;
            v
        };
        for turn in 0..=k {
            let delta = if turn == 0 { ids(prompt_len) } else { ids(5) };
            store
                .append_call(call(&id, turn, turn.checked_sub(1), delta, ids(12)))
                .await?;
        }
        store
            .set_reward(&id, None, f64::from(k) / 10.0, Some(json!({"acc": k % 2})))
            .await?;
        store.finish(&id).await?;
    }
    let mut opts = ExportOptions::new(Format::Parquet, Layout::Verl);
    opts.prompt_length = Some(p);
    opts.response_length = Some(r);
    opts.row_group_rows = 4;
    let stats = tito::export::to_file(
        store.as_ref(),
        &TrajectoryFilter::default(),
        &opts,
        std::path::Path::new(&out),
        &mut |_| {},
    )?;
    println!("{}", serde_json::to_string(&stats)?);
    Ok(())
}
