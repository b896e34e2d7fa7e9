//! Export of each layout in both formats: JSONL parsed back, Parquet read back
//! with the parquet crate, both compared; verl padding, masks, positions and
//! rm_scores; length limits; row groups; export straight from a store scan.

mod store_support;

use std::sync::Arc;

use parquet::column::reader::ColumnReader;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use serde::Deserialize;
use serde_json::{json, Value};
use store_support::{branching, with_missing_logprobs, without_logprobs};
use tito::export::{export, ExportOptions, ExportRow, ExportStats, Format, Layout};
use tito::store::{
    CallRecord, DynStore, MemoryStore, SpanStore, StoreError, Trajectory, TrajectoryFilter,
    TrajectoryStatus,
};

#[derive(Debug, Deserialize, PartialEq)]
struct Row {
    trajectory_id: String,
    sample: u32,
    call: Option<u32>,
    prompt_ids: Vec<u32>,
    response_ids: Vec<u32>,
    response_mask: Vec<u8>,
    response_logprobs: Vec<Option<f32>>,
    reward: Option<f64>,
    num_turns: u32,
    weight_version: Option<String>,
    tokenizer_sha256: String,
    template_sha256: String,
    finish_reason: String,
    truncated: bool,
    incomplete: bool,
    weight_versions: Vec<Option<String>>,
    call_offsets: Vec<u32>,
    min_weight_version: Option<String>,
    max_weight_version: Option<String>,
    data_source: Option<String>,
    index: Option<i64>,
    extra_info: Option<Value>,
    reward_extra_info: Option<Value>,
    replay_max_abs_diff: Option<f64>,
    replay_mean_abs_diff: Option<f64>,
    /// `group` in the trajectory layouts, `uid` in verl's.
    group: Option<String>,
    uid: Option<String>,
    input_ids: Option<Vec<u32>>,
    attention_mask: Option<Vec<u8>>,
    position_ids: Option<Vec<u32>>,
    rm_scores: Option<Vec<f32>>,
}

/// verl's column names for the columns every layout has.
const VERL_NAMES: [(&str, &str); 4] = [
    ("prompts", "prompt_ids"),
    ("responses", "response_ids"),
    ("rollout_log_probs", "response_logprobs"),
    ("__num_turns__", "num_turns"),
];

/// A row object with verl's names mapped to tito's, and JSON-text columns
/// (Parquet's encoding of `extra_info` / `reward_extra_info`) parsed.
fn canonical(mut obj: serde_json::Map<String, Value>, from_parquet: bool) -> Row {
    for (verl, tito) in VERL_NAMES {
        if let Some(v) = obj.remove(verl) {
            obj.insert(tito.to_string(), v);
        }
    }
    if from_parquet {
        for key in ["extra_info", "reward_extra_info"] {
            if let Some(Value::String(text)) = obj.get(key) {
                let parsed = serde_json::from_str(text).expect("JSON text column");
                obj.insert(key.to_string(), parsed);
            }
        }
    }
    serde_json::from_value(Value::Object(obj)).expect("row shape")
}

/// The logprob column's name in a layout.
fn logprobs_name(layout: Layout) -> &'static str {
    if layout == Layout::Verl {
        "rollout_log_probs"
    } else {
        "response_logprobs"
    }
}

async fn store_with(trajs: &[(&str, bool, Option<f64>)]) -> Arc<MemoryStore> {
    let store = Arc::new(MemoryStore::new());
    for (id, finish, reward) in trajs {
        for c in branching(id) {
            store.append_call(c).await.expect("append");
        }
        if let Some(r) = reward {
            store.set_reward(id, None, *r, None).await.expect("reward");
        }
        if *finish {
            store.finish(id).await.expect("finish");
        }
    }
    store
}

fn run(store: &dyn SpanStore, opts: &ExportOptions) -> (Vec<u8>, ExportStats) {
    let mut out = Vec::new();
    let it = store.scan(&TrajectoryFilter::default()).expect("scan");
    let stats = export(it, store, opts, &mut out, &mut |_| {}).expect("export");
    (out, stats)
}

fn parse_jsonl(bytes: &[u8]) -> Vec<Row> {
    std::str::from_utf8(bytes)
        .expect("utf8")
        .lines()
        .map(|l| match serde_json::from_str(l).expect("row parses") {
            Value::Object(obj) => canonical(obj, false),
            other => panic!("a row is not an object: {other}"),
        })
        .collect()
}

fn field_json(f: &Field) -> Value {
    match f {
        Field::Null => Value::Null,
        Field::Bool(b) => json!(b),
        Field::Int(i) => json!(i),
        Field::Long(i) => json!(i),
        Field::Float(x) => json!(f64::from(*x)),
        Field::Double(x) => json!(x),
        Field::Str(s) => json!(s),
        Field::ListInternal(list) => Value::Array(list.elements().iter().map(field_json).collect()),
        other => panic!("unexpected parquet field {other:?}"),
    }
}

/// Rows and the number of row groups of a Parquet file.
fn parse_parquet(bytes: Vec<u8>) -> (Vec<Row>, usize) {
    let reader = SerializedFileReader::new(bytes::Bytes::from(bytes)).expect("parquet opens");
    let groups = reader.metadata().num_row_groups();
    let rows = reader
        .get_row_iter(None)
        .expect("row iter")
        .map(|row| {
            let row = row.expect("row");
            let obj: serde_json::Map<String, Value> = row
                .get_column_iter()
                .map(|(name, f)| (name.clone(), field_json(f)))
                .collect();
            canonical(obj, true)
        })
        .collect();
    (rows, groups)
}

/// Exports in both formats and checks they carry identical rows.
fn both(
    store: &dyn SpanStore,
    layout: Layout,
    tweak: impl Fn(&mut ExportOptions),
) -> (Vec<Row>, ExportStats) {
    let mut jl = ExportOptions::new(Format::Jsonl, layout);
    tweak(&mut jl);
    let mut pq = jl.clone();
    pq.format = Format::Parquet;
    pq.row_group_rows = 2;
    let (jbytes, jstats) = run(store, &jl);
    let (pbytes, pstats) = run(store, &pq);
    assert_eq!(jstats, pstats);
    let jrows = parse_jsonl(&jbytes);
    let (prows, groups) = parse_parquet(pbytes);
    assert_eq!(jrows, prows, "JSONL and Parquet rows differ");
    assert_eq!(groups, jrows.len().div_ceil(2), "a row group every 2 rows");
    (jrows, jstats)
}

#[tokio::test]
async fn trajectory_layout_matches_samples() {
    let store = store_with(&[("a", true, Some(1.0)), ("b", false, None)]).await;
    let (rows, stats) = both(&*store, Layout::Trajectory, |_| {});
    assert_eq!(stats.trajectories, 2);
    assert_eq!(rows.len(), 6);
    let t: Trajectory = store
        .get_trajectory("a")
        .await
        .expect("get")
        .expect("stored");
    for (row, s) in rows.iter().zip(t.samples().expect("samples")) {
        assert_eq!(row.trajectory_id, "a");
        assert_eq!(row.sample, s.sample);
        assert_eq!(row.call, None);
        assert_eq!(row.prompt_ids, s.prompt_ids);
        assert_eq!(row.response_ids, s.response_ids);
        assert_eq!(row.response_mask, s.response_mask);
        assert_eq!(row.response_logprobs, s.response_logprobs);
        assert_eq!(row.reward, Some(1.0));
        assert_eq!(row.num_turns, s.num_turns);
        assert_eq!(row.weight_version, s.weight_version);
        assert_eq!(row.tokenizer_sha256, "tok-sha");
        assert_eq!(row.template_sha256, "tpl-sha");
        assert_eq!(row.finish_reason, "stop");
        assert!(!row.truncated);
        assert!(row.input_ids.is_none() && row.rm_scores.is_none());
    }
    assert!(rows[3..]
        .iter()
        .all(|r| r.trajectory_id == "b" && r.reward.is_none()));
}

#[tokio::test]
async fn jsonl_lines_have_the_design_columns() {
    let store = store_with(&[("a", true, Some(1.0))]).await;
    let (bytes, _) = run(
        &*store,
        &ExportOptions::new(Format::Jsonl, Layout::Trajectory),
    );
    let first: Value =
        serde_json::from_slice(bytes.split(|b| *b == b'\n').next().expect("a line")).expect("json");
    let keys: Vec<&str> = first
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "trajectory_id",
            "sample",
            "prompt_ids",
            "response_ids",
            "response_mask",
            "response_logprobs",
            "response_versions",
            "reward",
            "reward_extra_info",
            "num_turns",
            "group",
            "data_source",
            "index",
            "extra_info",
            "images",
            "image_sha256",
            "image_mime",
            "image_sizes",
            "image_grid_thw",
            "weight_version",
            "weight_versions",
            "call_offsets",
            "min_weight_version",
            "max_weight_version",
            "min_version",
            "max_version",
            "tokenizer_sha256",
            "template_sha256",
            "finish_reason",
            "truncated",
            "incomplete",
            "replay_max_abs_diff",
            "replay_mean_abs_diff",
            "model",
            "adapter"
        ]
    );
}

#[tokio::test]
async fn per_call_layout_has_full_prompts_and_all_ones_masks() {
    let store = store_with(&[("a", true, Some(1.0))]).await;
    store
        .set_reward("a", Some(4), 0.25, None)
        .await
        .expect("call reward");
    let (rows, _) = both(&*store, Layout::PerCall, |_| {});
    assert_eq!(rows.len(), 6);
    let t = store
        .get_trajectory("a")
        .await
        .expect("get")
        .expect("stored");
    for (row, c) in rows.iter().zip(&t.calls) {
        assert_eq!(row.call, Some(c.call_index));
        assert_eq!(row.sample, c.sample_index);
        assert_eq!(
            row.prompt_ids,
            t.full_prompt_ids(c.call_index).expect("prompt")
        );
        assert_eq!(row.response_ids, c.sampled_ids);
        assert_eq!(row.response_mask, vec![1; c.sampled_ids.len()]);
        assert_eq!(row.response_logprobs, c.logprobs);
    }
    assert_eq!(rows[4].num_turns, 4, "call 4 is 4 calls deep");
    assert_eq!(rows[4].reward, Some(0.25));
    assert_eq!(rows[3].reward, Some(1.0));
}

#[tokio::test]
async fn verl_layout_pads_masks_and_places_rm_scores() {
    let store = store_with(&[("a", true, Some(2.0))]).await;
    let (p, r) = (8usize, 30usize);
    let (rows, stats) = both(&*store, Layout::Verl, |o| {
        o.prompt_length = Some(p);
        o.response_length = Some(r);
        o.pad_id = 7;
    });
    let samples = store
        .get_trajectory("a")
        .await
        .expect("get")
        .expect("stored")
        .samples()
        .expect("samples");
    assert_eq!(rows.len(), 3);
    assert_eq!(stats.skipped_long_prompt, 0);
    for (row, s) in rows.iter().zip(&samples) {
        let n = s.prompt_ids.len();
        let m = s.response_ids.len().min(r);
        assert_eq!(row.prompt_ids.len(), p);
        assert_eq!(
            &row.prompt_ids[..p - n],
            &vec![7; p - n][..],
            "left padding"
        );
        assert_eq!(&row.prompt_ids[p - n..], &s.prompt_ids[..]);
        assert_eq!(row.response_ids.len(), r);
        assert_eq!(&row.response_ids[..m], &s.response_ids[..m]);
        assert!(
            row.response_ids[m..].iter().all(|&x| x == 7),
            "right padding"
        );
        assert_eq!(&row.response_mask[..m], &s.response_mask[..m]);
        assert!(row.response_mask[m..].iter().all(|&x| x == 0));
        assert_eq!(row.response_logprobs.len(), r);
        let attn = row.attention_mask.as_ref().expect("attention_mask");
        let expected_attn: Vec<u8> = [vec![0; p - n], vec![1; n + m], vec![0; r - m]].concat();
        assert_eq!(attn, &expected_attn);
        let pos = row.position_ids.as_ref().expect("position_ids");
        let mut expected_pos = vec![0u32; p - n];
        expected_pos.extend(0..(n + m) as u32);
        expected_pos.extend(vec![(n + m - 1) as u32; r - m]);
        assert_eq!(
            pos, &expected_pos,
            "cumsum(attention_mask) - 1, clipped at 0"
        );
        let input = row.input_ids.as_ref().expect("input_ids");
        assert_eq!(
            input,
            &[row.prompt_ids.clone(), row.response_ids.clone()].concat()
        );
        let rm = row.rm_scores.as_ref().expect("rm_scores");
        assert_eq!(rm.len(), r);
        // These rows end in a sampled token: the reward is on the last one.
        assert_eq!(s.response_mask[m - 1], 1);
        for (i, x) in rm.iter().enumerate() {
            assert_eq!(*x, if i == m - 1 { 2.0 } else { 0.0 }, "rm_scores[{i}]");
        }
        assert_eq!(row.truncated, s.response_ids.len() > r);
    }
    // Sample 1 has 20 response ids, samples 0 and 2 have 13 and 3: r = 16 cuts sample 1.
    let (cut, stats) = both(&*store, Layout::Verl, |o| {
        o.prompt_length = Some(p);
        o.response_length = Some(16);
    });
    assert_eq!(stats.truncated_responses, 1);
    assert!(cut[1].truncated && !cut[0].truncated);
    let rm = cut[1].rm_scores.as_ref().expect("rm_scores");
    assert_eq!(rm[15], 2.0, "reward on the last kept token");
    assert_eq!(cut[1].response_mask.len(), 16);
    // Its last call (c4, at offset 18) is cut away: the row ends in c3.
    assert_eq!(cut[1].call_offsets, vec![0, 5, 12]);
    assert_eq!(cut[1].weight_version.as_deref(), Some("step-3"));
    assert_eq!(cut[1].max_weight_version, cut[1].weight_version);
    assert_eq!(cut[1].finish_reason, "length");
    // Cut inside an observation: the row ends in mask-0 tokens, and the
    // reward stays on its last sampled token.
    let mask1 = &samples[1].response_mask;
    let r_obs = (1..mask1.len())
        .find(|&k| mask1[k - 1] == 0 && mask1[..k].contains(&1))
        .expect("sample 1 has an observation after a sampled token");
    let (cut, _) = both(&*store, Layout::Verl, |o| {
        o.prompt_length = Some(p);
        o.response_length = Some(r_obs);
    });
    let rm = cut[1].rm_scores.as_ref().expect("rm_scores");
    let last_sampled = mask1[..r_obs].iter().rposition(|&x| x == 1);
    assert_eq!(
        cut[1].response_mask[r_obs - 1],
        0,
        "the row ends in an observation"
    );
    assert_eq!(rm.iter().position(|&x| x == 2.0), last_sampled);
    // Sample 2 has a 6-id prompt, the others 5: prompt_length 5 skips it.
    let (kept, stats) = both(&*store, Layout::Verl, |o| {
        o.prompt_length = Some(5);
        o.response_length = Some(r);
    });
    assert_eq!(stats.skipped_long_prompt, 1);
    assert_eq!(
        kept.iter().map(|r| r.sample).collect::<Vec<_>>(),
        vec![0, 1]
    );
}

#[tokio::test]
async fn verl_needs_both_lengths() {
    let store = store_with(&[("a", true, None)]).await;
    let mut out = Vec::new();
    let opts = ExportOptions::new(Format::Parquet, Layout::Verl);
    let it = store.scan(&TrajectoryFilter::default()).expect("scan");
    assert!(export(it, &*store, &opts, &mut out, &mut |_| {}).is_err());
}

#[tokio::test]
async fn export_from_sqlite_scan_with_status_filter() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/spans.db", dir.path().display());
    let store = tito::store::open(&url).expect("open");
    for i in 0..40u32 {
        let id = format!("t-{i}");
        for c in branching(&id) {
            store.append_call(c).await.expect("append");
        }
        if i % 2 == 0 {
            store.finish(&id).await.expect("finish");
        }
    }
    let filter = TrajectoryFilter {
        status: Some(TrajectoryStatus::Finished),
        since: None,
        ..Default::default()
    };
    let mut opts = ExportOptions::new(Format::Parquet, Layout::Trajectory);
    opts.row_group_values = 100;
    let mut out = Vec::new();
    let mut progress = Vec::new();
    let stats = export(
        store.scan(&filter).expect("scan"),
        &*store,
        &opts,
        &mut out,
        &mut |s| progress.push(s.trajectories),
    )
    .expect("export");
    assert_eq!(stats.trajectories, 20);
    assert_eq!(stats.rows, 60);
    assert_eq!(progress, (1..=20).collect::<Vec<u64>>());
    let (rows, groups) = parse_parquet(out);
    assert_eq!(rows.len(), 60);
    assert!(
        groups > 10,
        "value limit flushes row groups early ({groups})"
    );
    assert!(rows.iter().all(|r| r
        .trajectory_id
        .trim_start_matches("t-")
        .parse::<u32>()
        .expect("id")
        % 2
        == 0));
}

#[tokio::test]
async fn empty_export_is_a_valid_file() {
    let store = MemoryStore::new();
    let (bytes, stats) = run(
        &store,
        &ExportOptions::new(Format::Parquet, Layout::Trajectory),
    );
    assert_eq!(stats.rows, 0);
    let (rows, groups) = parse_parquet(bytes);
    assert!(rows.is_empty());
    assert_eq!(groups, 0);
}

#[tokio::test]
async fn a_store_error_mid_scan_fails_the_export() {
    let t = store_with(&[("a", true, None)]).await;
    let good = t.get_trajectory("a").await.expect("get").expect("stored");
    let items: Vec<Result<Trajectory, StoreError>> =
        vec![Ok(good), Err(StoreError::Corrupt("bad blob".into()))];
    let mut out = Vec::new();
    let opts = ExportOptions::new(Format::Jsonl, Layout::Trajectory);
    assert!(export(items.into_iter(), &*t, &opts, &mut out, &mut |_| {}).is_err());
}

/// A fresh SQLite store (logprobs go through its BLOB codec) holding `calls`.
async fn sqlite_with(dir: &tempfile::TempDir, calls: &[CallRecord]) -> DynStore {
    let url = format!("sqlite://{}/spans.db", dir.path().display());
    let store = tito::store::open(&url).expect("open");
    for c in calls {
        store.append_call(c.clone()).await.expect("append");
    }
    store
}

/// The `response_logprobs` of a sample over `path` (indices into `calls`),
/// built by hand: null on observation ids (every later call's prompt delta),
/// the call's own logprobs on its sampled ids.
fn expected_logprobs(calls: &[CallRecord], path: &[usize]) -> Vec<Option<f32>> {
    let mut out = Vec::new();
    for (i, &c) in path.iter().enumerate() {
        if i > 0 {
            out.extend(vec![None; calls[c].prompt_delta_ids.len()]);
        }
        out.extend_from_slice(&calls[c].logprobs);
    }
    out
}

/// One row's `response_logprobs`.
type Logprobs = Vec<Option<f32>>;

/// Changes options before an export (lengths for verl).
type Tweak<'a> = &'a dyn Fn(&mut ExportOptions);

/// Samples of [`branching`]: root-to-leaf paths of call indices.
const PATHS: [&[usize]; 3] = [&[0, 1, 2], &[0, 1, 3, 4], &[5]];

/// Checks the JSON text itself: `response_logprobs[i]` is `null` exactly
/// where `expected[row][i]` is `None` (so on every mask-0 position), and the
/// same f32 elsewhere.
fn assert_jsonl_logprobs(bytes: &[u8], layout: Layout, expected: &[Vec<Option<f32>>]) {
    let lines: Vec<Value> = std::str::from_utf8(bytes)
        .expect("utf8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(lines.len(), expected.len());
    for (n, (line, want)) in lines.iter().zip(expected).enumerate() {
        let got = line[logprobs_name(layout)].as_array().expect("logprobs");
        let mask = line["response_mask"].as_array().expect("mask");
        assert_eq!(got.len(), want.len(), "row {n}");
        assert_eq!(got.len(), mask.len(), "row {n}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            match w {
                None => assert!(g.is_null(), "row {n}[{i}]: {g} for a missing logprob"),
                Some(x) => assert_eq!(g.as_f64().map(|g| g as f32), Some(*x), "row {n}[{i}]"),
            }
            if mask[i] == 0 {
                assert!(g.is_null(), "row {n}[{i}]: mask 0 but logprob {g}");
            }
        }
    }
}

/// Definition levels, repetition levels and values of the
/// `response_logprobs` column, over all row groups.
fn logprob_column(bytes: Vec<u8>, layout: Layout) -> (Vec<i16>, Vec<i16>, Vec<f32>) {
    let reader = SerializedFileReader::new(bytes::Bytes::from(bytes)).expect("parquet opens");
    let schema = reader.metadata().file_metadata().schema_descr();
    let idx = (0..schema.num_columns())
        .find(|&i| schema.column(i).path().parts()[0] == logprobs_name(layout))
        .expect("logprobs column");
    let col = schema.column(idx);
    assert_eq!(col.max_def_level(), 2, "list<optional float>");
    assert_eq!(col.max_rep_level(), 1);
    assert!(col.self_type().is_optional(), "elements are nullable");
    let (mut def, mut rep, mut vals) = (Vec::new(), Vec::new(), Vec::new());
    for g in 0..reader.num_row_groups() {
        let group = reader.get_row_group(g).expect("row group");
        let rows = group.metadata().num_rows() as usize;
        match group.get_column_reader(idx).expect("column reader") {
            ColumnReader::FloatColumnReader(mut r) => {
                let (records, _, _) = r
                    .read_records(rows, Some(&mut def), Some(&mut rep), &mut vals)
                    .expect("read");
                assert_eq!(records, rows);
            }
            _ => panic!("response_logprobs is not a float column"),
        }
    }
    (def, rep, vals)
}

fn export_row(logprobs: Vec<Option<f32>>) -> ExportRow {
    let n = logprobs.len();
    ExportRow {
        trajectory_id: "t".into(),
        sample: 0,
        call: None,
        prompt_ids: vec![1, 2],
        response_ids: vec![3; n],
        response_mask: vec![1; n],
        response_logprobs: logprobs,
        response_versions: vec![None; n],
        reward: None,
        reward_extra_info: None,
        num_turns: 1,
        weight_version: None,
        weight_versions: vec![None],
        call_offsets: vec![0],
        min_weight_version: None,
        max_weight_version: None,
        min_version: None,
        max_version: None,
        group: None,
        data_source: None,
        index: None,
        extra_info: None,
        tokenizer_sha256: "tok".into(),
        template_sha256: "tpl".into(),
        finish_reason: "stop".into(),
        truncated: false,
        incomplete: false,
        replay_max_abs_diff: None,
        replay_mean_abs_diff: None,
        verl: None,
        images: Vec::new(),
        pixel_values: None,
        model: None,
        adapter: None,
    }
}

#[test]
fn parquet_logprobs_are_a_list_of_optional_floats() {
    let lists = vec![
        vec![Some(-0.5), None],
        vec![],
        vec![None],
        vec![Some(0.0), Some(-1.0)],
    ];
    let opts = ExportOptions::new(Format::Parquet, Layout::Trajectory);
    let mut out = Vec::new();
    {
        let mut sink = tito::export::sink(&opts, &mut out).expect("sink");
        for lp in &lists {
            sink.write_row(&export_row(lp.clone())).expect("row");
        }
        sink.finish().expect("finish");
    }
    // Empty list def 0; null element def 1 (no value); value def 2.
    let (def, rep, vals) = logprob_column(out.clone(), Layout::Trajectory);
    assert_eq!(def, [2, 1, 0, 1, 2, 2]);
    assert_eq!(rep, [0, 1, 0, 0, 0, 1]);
    assert_eq!(vals, [-0.5, 0.0, -1.0]);
    let (rows, _) = parse_parquet(out);
    let got: Vec<_> = rows.into_iter().map(|r| r.response_logprobs).collect();
    assert_eq!(got, lists);
}

/// JSON has no infinities: a real `-inf` logprob (the store keeps it) is
/// `null` in JSONL, like a missing one, and stays `-inf` in Parquet, the
/// format that tells them apart (docs/export.md).
#[test]
fn a_minus_infinity_logprob_is_kept_by_parquet_and_null_in_jsonl() {
    let lp = vec![Some(f32::NEG_INFINITY), None, Some(-0.5)];
    let mut written = Vec::new();
    for format in [Format::Parquet, Format::Jsonl] {
        let opts = ExportOptions::new(format, Layout::Trajectory);
        let mut out = Vec::new();
        {
            let mut sink = tito::export::sink(&opts, &mut out).expect("sink");
            sink.write_row(&export_row(lp.clone())).expect("row");
            sink.finish().expect("finish");
        }
        written.push(out);
    }
    let (def, _, vals) = logprob_column(written[0].clone(), Layout::Trajectory);
    assert_eq!(def, [2, 1, 2], "-inf is a value, the missing one is null");
    assert_eq!(vals, [f32::NEG_INFINITY, -0.5]);
    let line: Value = serde_json::from_slice(&written[1]).expect("one JSON line");
    assert_eq!(
        line["response_logprobs"],
        serde_json::json!([null, null, -0.5])
    );
}

#[tokio::test]
async fn missing_logprobs_and_observations_export_as_null() {
    let dir = tempfile::tempdir().expect("tempdir");
    let calls = with_missing_logprobs("g");
    let store = sqlite_with(&dir, &calls).await;
    let samples: Vec<_> = PATHS.iter().map(|p| expected_logprobs(&calls, p)).collect();
    assert_eq!(samples[0][4], None, "an observation id");
    let per_call: Vec<_> = calls.iter().map(|c| c.logprobs.clone()).collect();
    let (p, r) = (8usize, 30usize);
    let padded: Vec<_> = samples
        .iter()
        .map(|lp| [lp.clone(), vec![None; r - lp.len()]].concat())
        .collect();
    let verl = |o: &mut ExportOptions| {
        o.prompt_length = Some(p);
        o.response_length = Some(r);
    };
    let cases: [(Layout, Tweak, &[Logprobs]); 3] = [
        (Layout::Trajectory, &|_| {}, &samples),
        (Layout::PerCall, &|_| {}, &per_call),
        (Layout::Verl, &verl, &padded),
    ];
    for (layout, tweak, want) in cases {
        // Parquet read back equals JSONL parsed back (nulls included).
        let (rows, _) = both(&*store, layout, tweak);
        let got: Vec<_> = rows.into_iter().map(|r| r.response_logprobs).collect();
        assert_eq!(got, want, "{layout:?}");
        let mut opts = ExportOptions::new(Format::Jsonl, layout);
        tweak(&mut opts);
        assert_jsonl_logprobs(&run(&*store, &opts).0, layout, want);
        // In Parquet: one null element (def 1) per missing logprob, and only
        // the real values are stored.
        opts.format = Format::Parquet;
        let (def, _, vals) = logprob_column(run(&*store, &opts).0, layout);
        let flat: Vec<_> = want.iter().flatten().copied().collect();
        let defs: Vec<i16> = flat
            .iter()
            .map(|x| if x.is_some() { 2 } else { 1 })
            .collect();
        assert_eq!(def, defs, "{layout:?}");
        assert_eq!(vals, flat.into_iter().flatten().collect::<Vec<_>>());
    }
}

#[tokio::test]
async fn a_trajectory_without_logprobs_exports_no_number() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sqlite_with(&dir, &without_logprobs(branching("n"))).await;
    let verl = |o: &mut ExportOptions| {
        o.prompt_length = Some(8);
        o.response_length = Some(30);
    };
    let cases: [(Layout, Tweak); 3] = [
        (Layout::Trajectory, &|_| {}),
        (Layout::PerCall, &|_| {}),
        (Layout::Verl, &verl),
    ];
    for (layout, tweak) in cases {
        let (rows, _) = both(&*store, layout, tweak);
        assert!(!rows.is_empty());
        for row in &rows {
            assert!(!row.response_logprobs.is_empty());
            assert!(
                row.response_logprobs.iter().all(Option::is_none),
                "{layout:?}"
            );
        }
        let mut opts = ExportOptions::new(Format::Jsonl, layout);
        tweak(&mut opts);
        let text = run(&*store, &opts).0;
        for line in std::str::from_utf8(&text).expect("utf8").lines() {
            let v: Value = serde_json::from_str(line).expect("json");
            let lp = v[logprobs_name(layout)].as_array().expect("logprobs");
            assert!(lp.iter().all(Value::is_null), "{layout:?}: {lp:?}");
        }
        opts.format = Format::Parquet;
        let (def, _, vals) = logprob_column(run(&*store, &opts).0, layout);
        assert!(vals.is_empty(), "{layout:?}: values {vals:?}");
        assert!(
            def.iter().all(|&d| d == 1),
            "{layout:?}: only null elements"
        );
    }
}
