//! `tito export` end to end: a SQLite store written by the library, a config
//! pointing at it, the real binary producing JSONL and verl Parquet files.

mod store_support;

use std::path::Path;
use std::process::Command;

use store_support::{branching, without_logprobs};

fn write_config(dir: &Path, db: &Path) -> std::path::PathBuf {
    let path = dir.join("config.toml");
    let text = format!(
        "[model]\ntokenizer = \"unused\"\n\n[[backends]]\nurl = \"http://127.0.0.1:9\"\nkind = \"vllm\"\n\n\
         [store]\nurl = \"sqlite://{}\"\n",
        db.display()
    );
    std::fs::write(&path, text).expect("write config");
    path
}

async fn populate(db: &Path) {
    let store = tito::store::open(&format!("sqlite://{}", db.display())).expect("open");
    for i in 0..5 {
        let id = format!("t-{i}");
        for c in branching(&id) {
            store.append_call(c).await.expect("append");
        }
        if i != 4 {
            store
                .set_reward(&id, None, f64::from(i), None)
                .await
                .expect("reward");
            store.finish(&id).await.expect("finish");
        }
    }
}

fn tito(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tito"))
        .args(args)
        .output()
        .expect("run tito")
}

#[tokio::test]
async fn cli_exports_jsonl_and_verl_parquet() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("data/spans.db");
    populate(&db).await;
    let config = write_config(dir.path(), &db);
    let config = config.to_str().expect("utf8 path");

    let out = dir.path().join("out.jsonl");
    let o = tito(&[
        "export",
        "--config",
        config,
        "--format",
        "jsonl",
        "--layout",
        "trajectory",
        "--status",
        "finished",
        "--out",
        out.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&out).expect("jsonl written");
    assert_eq!(
        text.lines().count(),
        12,
        "4 finished trajectories x 3 samples"
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("4 trajectories, 12 rows"));
    assert!(!dir.path().join("out.jsonl.partial").exists());

    let pq = dir.path().join("out.parquet");
    let o = tito(&[
        "export",
        "--config",
        config,
        "--format",
        "parquet",
        "--layout",
        "verl",
        "--prompt-length",
        "8",
        "--response-length",
        "32",
        "--pad-id",
        "7",
        "--out",
        pq.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    use parquet::file::reader::FileReader;
    let reader =
        parquet::file::reader::SerializedFileReader::try_from(pq.as_path()).expect("parquet");
    assert_eq!(reader.metadata().file_metadata().num_rows(), 15);

    // verl without lengths, and a missing store, fail with a message.
    let o = tito(&[
        "export", "--config", config, "--format", "parquet", "--layout", "verl", "--out", "x",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("prompt_length"));
    // verl pads with the tokenizer's pad id unless told: this config's
    // tokenizer does not exist, and the error says so.
    let o = tito(&[
        "export",
        "--config",
        config,
        "--format",
        "parquet",
        "--layout",
        "verl",
        "--prompt-length",
        "8",
        "--response-length",
        "32",
        "--out",
        "x",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("tokenizer"));
    // Lengths have an upper bound.
    let o = tito(&[
        "export",
        "--config",
        config,
        "--format",
        "jsonl",
        "--layout",
        "verl",
        "--prompt-length",
        "8",
        "--response-length",
        "131073",
        "--pad-id",
        "0",
        "--out",
        "x",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("above the limit of 131072"));
    let other_dir = dir.path().join("other");
    std::fs::create_dir_all(&other_dir).expect("mkdir");
    let other = write_config(&other_dir, &dir.path().join("missing.db"));
    let o = tito(&[
        "export",
        "--config",
        other.to_str().expect("utf8"),
        "--format",
        "jsonl",
        "--out",
        "x",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no span store"));
}

/// A trajectory recorded without any logprob exports no number in
/// `response_logprobs` through the CLI: JSONL nulls, Parquet null elements.
#[tokio::test]
async fn cli_exports_missing_logprobs_as_nulls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("spans.db");
    {
        let store = tito::store::open(&format!("sqlite://{}", db.display())).expect("open");
        for c in without_logprobs(branching("n")) {
            store.append_call(c).await.expect("append");
        }
    }
    let config = write_config(dir.path(), &db);
    let config = config.to_str().expect("utf8 path");
    let lengths = [
        "--prompt-length",
        "8",
        "--response-length",
        "32",
        "--pad-id",
        "0",
    ];
    for (format, layout) in [
        ("jsonl", "per_call"),
        ("jsonl", "verl"),
        ("parquet", "verl"),
    ] {
        let out = dir.path().join(format!("{layout}.{format}"));
        let mut args = vec![
            "export", "--config", config, "--format", format, "--layout", layout,
        ];
        if layout == "verl" {
            args.extend(lengths);
        }
        args.extend(["--out", out.to_str().expect("utf8")]);
        let o = tito(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let column = if layout == "verl" {
            "rollout_log_probs"
        } else {
            "response_logprobs"
        };
        let lists: Vec<Vec<bool>> = if format == "jsonl" {
            std::fs::read_to_string(&out)
                .expect("jsonl written")
                .lines()
                .map(|l| {
                    let v: serde_json::Value = serde_json::from_str(l).expect("json");
                    let lp = v[column].as_array().expect("logprobs");
                    lp.iter().map(serde_json::Value::is_null).collect()
                })
                .collect()
        } else {
            use parquet::file::reader::FileReader;
            use parquet::record::Field;
            let reader = parquet::file::reader::SerializedFileReader::try_from(out.as_path())
                .expect("parquet");
            reader
                .get_row_iter(None)
                .expect("rows")
                .map(|row| {
                    let row = row.expect("row");
                    let (_, lp) = row
                        .get_column_iter()
                        .find(|(name, _)| name.as_str() == column)
                        .expect("column");
                    match lp {
                        Field::ListInternal(l) => {
                            l.elements().iter().map(|f| *f == Field::Null).collect()
                        }
                        other => panic!("{column} is {other:?}"),
                    }
                })
                .collect()
        };
        let rows = if layout == "per_call" { 6 } else { 3 };
        assert_eq!(lists.len(), rows, "{format} {layout}");
        for nulls in &lists {
            assert!(!nulls.is_empty(), "{format} {layout}");
            assert!(nulls.iter().all(|n| *n), "{format} {layout}: a number");
        }
    }
}
