//! The replay check against mock backends that remember what they sampled:
//! a replay of the recorded logprobs is exact (every |Δ| is 0) and the
//! argmax share is what the mock scripted; shifted positions are named
//! exactly; the SGLang form is read; errors have the OpenAI shape; the route
//! takes a trainer token; the sampled background mode checks a finished
//! trajectory once; `tito verify` prints one line per sample and a summary.

mod common;

use std::sync::{Arc, Mutex};

use axum::response::IntoResponse;
use common::mock_vllm::{MockVllm, Scripted, UNSEEN_LOGPROB};
use common::{config, start_gateway, start_gateway_on, Gateway};
use serde_json::{json, Value};
use tito::render::testing::{chatml_renderer, IM_END};

/// The mock's logprob for the i-th sampled token of a reply.
fn lp(i: usize) -> f32 {
    -0.125 - i as f32 / 16.0
}

/// A reply of `text` + `<|im_end|>` with known logprobs and ranks.
fn reply(g: &Gateway, text: &str, ranks: Option<Vec<u32>>) -> Scripted {
    let mut ids = g.renderer.encode(text).expect("encodes");
    ids.push(IM_END);
    Scripted {
        logprobs: Some((0..ids.len()).map(lp).collect()),
        ranks,
        ids,
        ..Default::default()
    }
}

/// Two turns on trajectory `tid` (the second prompt carries observation
/// tokens: the user's next message), then finish. Returns the sample as
/// `GET /v1/trajectories/{tid}` shows it.
async fn two_turns(g: &Gateway, tid: &str) -> Value {
    let path = format!("/t/{tid}/v1/chat/completions");
    let first = json!({"messages": [{"role": "user", "content": "hi"}]});
    let r: Value = g.post(&path, first).await.json().await.expect("json");
    let served = r["choices"][0]["message"]["content"].clone();
    let second = json!({"messages": [{"role": "user", "content": "hi"},
        {"role": "assistant", "content": served}, {"role": "user", "content": "more"}]});
    assert_eq!(g.post(&path, second).await.status(), 200);
    let finish = g
        .post(&format!("/v1/trajectories/{tid}/finish"), json!({}))
        .await;
    assert_eq!(finish.status(), 200);
    g.get_json(&format!("/v1/trajectories/{tid}")).await["samples"][0].clone()
}

async fn verify(g: &Gateway, tid: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = g
        .client
        .post(g.url(&format!("/v1/trajectories/{tid}/verify")));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.expect("gateway reachable");
    let status = r.status().as_u16();
    (status, r.json().await.expect("json body"))
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("ids")
}

/// Response positions with mask 1.
fn sampled_positions(sample: &Value) -> Vec<usize> {
    let mask: Vec<u8> = serde_json::from_value(sample["response_mask"].clone()).expect("mask");
    (0..mask.len()).filter(|&i| mask[i] == 1).collect()
}

#[tokio::test]
async fn a_replay_of_the_sampled_logprobs_is_exact_with_the_scripted_argmax_share() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let first = reply(&g, "hello there", Some(vec![1, 2, 1, 5]));
    let n1 = first.ids.len();
    mock.push(first);
    mock.push(reply(&g, "and more", None));
    let sample = two_turns(&g, "v-exact").await;
    let compared = sampled_positions(&sample).len();
    assert!(compared > n1, "both turns' tokens are sampled");

    let (status, body) = verify(&g, "v-exact", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "trajectory.verify");
    assert_eq!(body["trajectory_id"], "v-exact");
    assert_eq!(body["threshold"], 0.1, "the [verify] default");
    let s = &body["samples"][0];
    assert_eq!(s["compared"], compared, "every sampled token is compared");
    assert_eq!(s["max_abs_diff"], 0.0);
    assert_eq!(s["mean_abs_diff"], 0.0);
    assert_eq!(s["positions"], json!([]));
    assert_eq!(s["above_threshold"], 0);
    // Ranks 2 and 5 among the scripted ones: 2 tokens not the argmax.
    let share = s["argmax_mismatch_share"].as_f64().expect("ranks given");
    assert!((share - 2.0 / compared as f64).abs() < 1e-12, "{share}");

    // The mock was asked for exactly the sample's full sequence.
    let scored = mock
        .requests()
        .into_iter()
        .find(|r| !r["prompt_logprobs"].is_null())
        .expect("a scoring request");
    let mut seq = ids(&sample["prompt_ids"]);
    seq.extend(ids(&sample["response_ids"]));
    assert_eq!(ids(&scored["prompt"]), seq);
    assert_eq!(
        scored["prompt_logprobs"], 1,
        "the own token and the most likely one"
    );
    assert_eq!(scored["stream"], false);

    // Stored with the sample, exported, and observed in the histogram.
    let shown = g.get_json("/v1/trajectories/v-exact").await;
    assert_eq!(shown["samples"][0]["replay"]["compared"], compared);
    let rows = g.export_jsonl("layout=trajectory").await;
    assert_eq!(rows[0]["replay_max_abs_diff"], 0.0);
    assert_eq!(rows[0]["replay_mean_abs_diff"], 0.0);
    let metrics = g.get_text("/metrics").await;
    assert!(
        metrics.contains("tito_replay_logprob_abs_diff_bucket"),
        "{metrics}"
    );
    assert!(metrics.contains("tito_replay_check_samples_total"));
}

#[tokio::test]
async fn shifted_positions_are_named_exactly_and_observations_never() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    mock.push(reply(&g, "hello there", None));
    mock.push(reply(&g, "and more", None));
    let sample = two_turns(&g, "v-shift").await;
    let p = ids(&sample["prompt_ids"]).len();
    let sampled = sampled_positions(&sample);
    let mask: Vec<u8> = serde_json::from_value(sample["response_mask"].clone()).expect("mask");
    let observation = (0..mask.len())
        .find(|&i| mask[i] == 0)
        .expect("an observation");
    let (a, b, c) = (sampled[1], sampled[3], *sampled.last().expect("sampled"));
    mock.shift_replay(p + a, -0.5);
    mock.shift_replay(p + b, 0.05);
    mock.shift_replay(p + c, 2.0);
    mock.shift_replay(p + observation, 5.0);

    let (status, body) = verify(&g, "v-shift", None).await;
    assert_eq!(status, 200, "{body}");
    let s = &body["samples"][0];
    let named: Vec<u64> = s["positions"]
        .as_array()
        .expect("positions")
        .iter()
        .map(|x| x["position"].as_u64().expect("position"))
        .collect();
    assert_eq!(named, vec![c as u64, a as u64], "above 0.1, largest first");
    assert_eq!(s["above_threshold"], 2);
    let response = ids(&sample["response_ids"]);
    let top = &s["positions"][0];
    assert_eq!(top["token_id"], response[c]);
    let recorded = top["recorded"].as_f64().expect("recorded");
    let replayed = top["replayed"].as_f64().expect("replayed");
    assert!((replayed - recorded - 2.0).abs() < 1e-5, "{top}");
    assert!((s["max_abs_diff"].as_f64().expect("max") - 2.0).abs() < 1e-5);
    let mean = s["mean_abs_diff"].as_f64().expect("mean");
    let want = (0.5 + 0.05 + 2.0) / sampled.len() as f64;
    assert!((mean - want).abs() < 1e-5, "{mean} vs {want}");

    // A lower threshold names the small shift too; the report echoes it.
    let (_, body) = verify(&g, "v-shift", Some(json!({"threshold": 0.01}))).await;
    assert_eq!(body["threshold"], 0.01);
    let s = &body["samples"][0];
    assert_eq!(s["above_threshold"], 3);
    assert_eq!(s["positions"][2]["position"], b);
    // Stored: the newer check replaced the older one.
    let shown = g.get_json("/v1/trajectories/v-shift").await;
    assert_eq!(shown["samples"][0]["replay"]["threshold"], 0.01);
}

#[tokio::test]
async fn errors_have_the_openai_shape() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let extra = "[[backends]]\nurl = \"http://127.0.0.1:9\"\nkind = \"vllm\"\nname = \"dead\"\n";
    let g = start_gateway(config(&[mock.url()], extra)).await;
    mock.push(reply(&g, "hello", None));
    let path = "/t/v-err/v1/chat/completions";
    let first = json!({"messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(g.post(path, first).await.status(), 200);

    let (status, body) = verify(&g, "nope", None).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "not_found");
    assert!(body["error"]["message"]
        .as_str()
        .expect("message")
        .contains("nope"));

    for (bad, param) in [
        (json!({"threshold": -1.0}), "threshold"),
        (json!({"backend": "missing"}), "backend"),
    ] {
        let (status, body) = verify(&g, "v-err", Some(bad)).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["param"], param);
    }
    let (status, body) = verify(&g, "v-err", Some(json!({"treshold": 1}))).await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"]
        .as_str()
        .expect("message")
        .contains("treshold"));

    // The named backend is down: 502, and nothing is stored.
    let (status, body) = verify(&g, "v-err", Some(json!({"backend": "dead"}))).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["error"]["type"], "backend_error");
    let shown = g.get_json("/v1/trajectories/v-err").await;
    assert_eq!(shown["samples"][0]["replay"], Value::Null);
}

#[tokio::test]
async fn the_verify_route_is_a_trainer_route() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let auth = "[auth]\napi_keys = [\"api-key-1\"]\ntrainer_tokens = [\"trainer-1\"]\n";
    let g = start_gateway(config(&[mock.url()], auth)).await;
    let post = |token: Option<&'static str>| {
        let mut req = g.client.post(g.url("/v1/trajectories/any/verify"));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send()
    };
    let r = post(None).await.expect("reachable");
    assert_eq!(r.status(), 401);
    let r = post(Some("api-key-1")).await.expect("reachable");
    assert_eq!(r.status(), 401, "an API key is not a trainer token");
    let r = post(Some("trainer-1")).await.expect("reachable");
    assert_eq!(r.status(), 404, "authorized: the trajectory is unknown");
}

#[tokio::test]
async fn too_long_samples_are_refused_before_any_backend_call() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let cfg = config(&[mock.url()], "");
    let store = tito::store::open("memory://").expect("store");
    let g = start_gateway_on(cfg.clone(), chatml_renderer(), store.clone()).await;
    mock.push(reply(&g, "hello", None));
    let sample = two_turns(&g, "v-long").await;
    let len = ids(&sample["prompt_ids"]).len() + ids(&sample["response_ids"]).len();
    let router = tito::router::Router::new(&cfg.router);
    let backends = tito::api::build_backends(&cfg).expect("backends");
    router
        .add_backend(backends[0].clone(), mock.url())
        .expect("add");
    let scope = tito::verify::Scope::single("test-model", &router);
    let opts = tito::verify::Options {
        max_len: Some(len - 1),
        ..Default::default()
    };
    let err = tito::verify::verify_trajectory(&scope, &store, "v-long", &opts)
        .await
        .expect_err("too long");
    assert!(
        matches!(err, tito::verify::VerifyError::TooLong { .. }),
        "{err}"
    );
    assert!(err.to_string().contains(&format!("{len} tokens")), "{err}");
    assert!(mock
        .requests()
        .iter()
        .all(|r| r["prompt_logprobs"].is_null()));
    let opts = tito::verify::Options {
        max_len: Some(len),
        ..Default::default()
    };
    let report = tito::verify::verify_trajectory(&scope, &store, "v-long", &opts)
        .await
        .expect("fits exactly");
    assert_eq!(report.samples[0].replay.max_abs_diff, Some(0.0));
}

#[tokio::test]
async fn the_sampled_background_mode_checks_a_finished_trajectory_once() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let cfg = config(&[mock.url()], "[verify]\nfraction = 1.0\n");
    let watched =
        common::watched_store::WatchedStore::new(tito::store::open("memory://").expect("store"));
    let store: tito::store::DynStore = watched.clone();
    let g = start_gateway_on(cfg.clone(), chatml_renderer(), store.clone()).await;
    mock.push(reply(&g, "hello", None));
    mock.push(reply(&g, "again", None));
    two_turns(&g, "v-bg").await;
    mock.wait_scored(1).await;
    // The background check stores its result right after the backend answered.
    let stored = watched.replay_of("v-bg").await;
    assert_eq!(stored.max_abs_diff, Some(0.0));
    assert!(stored.compared > 0);

    // A trajectory already checked is not checked again (a repeated finish).
    let router = tito::router::Router::new(&cfg.router);
    let backends = tito::api::build_backends(&cfg).expect("backends");
    router
        .add_backend(backends[0].clone(), mock.url())
        .expect("add");
    let opts = tito::verify::Options::default();
    let served = (std::sync::Arc::from("test-model"), router, true);
    let bg = tito::verify::background::Background::new(served, store.clone(), opts, 1.0);
    assert!(bg.check("v-bg").await.expect("no error").is_none());
    assert!(bg.check("unknown").await.expect("no error").is_none());
}

/// (prompt, sampled ids) of an answer the SGLang mock gave.
type Answered = (Vec<u32>, Vec<u32>);

/// SGLang's `/generate`: streams the scripted answer with its logprobs, and
/// answers a scoring request (`logprob_start_len: 0`, `max_new_tokens: 0`)
/// with `input_token_logprobs` from what it sampled, and top-1 lists in
/// which the sampled token at response position `not_top` is not the top.
async fn sglang_mock(answer: Vec<u32>, not_top: usize) -> (String, Arc<Mutex<Vec<Value>>>) {
    use axum::routing::{get, post};
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let sampled: Arc<Mutex<Vec<Answered>>> = Arc::default();
    let generate = move |axum::Json(body): axum::Json<Value>| {
        let answer = answer.clone();
        let log = log.clone();
        let sampled = sampled.clone();
        async move {
            log.lock().expect("lock").push(body.clone());
            let input = ids(&body["input_ids"]);
            if body["logprob_start_len"] == 0 {
                let known = sampled.lock().expect("lock").clone();
                let mut tokens = Vec::new();
                let mut tops = Vec::new();
                for (pos, &id) in input.iter().enumerate() {
                    // Response position of a token this mock sampled.
                    let r = known.iter().find_map(|(prompt, out)| {
                        let r = pos.checked_sub(prompt.len())?;
                        (input.starts_with(prompt) && out.get(r) == Some(&id)).then_some(r)
                    });
                    let lp = match (pos, r) {
                        (0, _) => None,
                        (_, Some(r)) => Some(lp(r)),
                        (_, None) => Some(UNSEEN_LOGPROB),
                    };
                    tokens.push(json!([lp, id, null]));
                    tops.push(match (lp, r) {
                        (None, _) => Value::Null,
                        (Some(_), Some(r)) if r == not_top => json!([[-0.01, 99_999, null]]),
                        (Some(v), _) => json!([[v, id, null]]),
                    });
                }
                let meta = json!({"input_token_logprobs": tokens, "input_top_logprobs": tops,
                                  "finish_reason": {"type": "length"}, "completion_tokens": 0});
                return axum::Json(json!({"text": "", "output_ids": [], "meta_info": meta}))
                    .into_response();
            }
            sampled.lock().expect("lock").push((input, answer.clone()));
            let lps: Vec<Value> = answer
                .iter()
                .enumerate()
                .map(|(i, id)| json!([lp(i), id, null]))
                .collect();
            let meta = json!({"completion_tokens": answer.len(), "output_token_logprobs": lps,
                              "finish_reason": {"type": "stop", "matched": IM_END}});
            let ev = json!({"output_ids": answer, "meta_info": meta});
            (
                [("content-type", "text/event-stream")],
                format!("data: {ev}\n\ndata: [DONE]\n\n"),
            )
                .into_response()
        }
    };
    let app = axum::Router::new()
        .route("/generate", post(generate))
        .route("/health", get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), seen)
}

#[tokio::test]
async fn the_sglang_form_is_asked_and_read() {
    let renderer = chatml_renderer();
    let mut answer = renderer.encode("from sglang").expect("encodes");
    answer.push(IM_END);
    // The second sampled token is not the replay's argmax.
    let (url, seen) = sglang_mock(answer.clone(), 1).await;
    let extra = format!("[[backends]]\nurl = \"{url}\"\nkind = \"sglang\"\n");
    let g = start_gateway(config(&[], &extra)).await;
    let first = json!({"messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        g.post("/t/v-sg/v1/chat/completions", first).await.status(),
        200
    );

    let (status, body) = verify(&g, "v-sg", None).await;
    assert_eq!(status, 200, "{body}");
    let s = &body["samples"][0];
    assert_eq!(s["compared"], answer.len());
    assert_eq!(s["max_abs_diff"], 0.0);
    let share = s["argmax_mismatch_share"]
        .as_f64()
        .expect("top lists given");
    assert!((share - 1.0 / answer.len() as f64).abs() < 1e-12, "{share}");
    let asked = seen
        .lock()
        .expect("lock")
        .iter()
        .find(|b| b["logprob_start_len"] == 0)
        .cloned()
        .expect("a scoring request");
    assert_eq!(asked["sampling_params"]["max_new_tokens"], 0);
    assert_eq!(asked["return_logprob"], true);
    assert_eq!(asked["top_logprobs_num"], 1);
    assert_eq!(asked["stream"], false);
}

fn tito(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_tito"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run tito")
}

fn json_lines(out: &std::process::Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tito_verify_prints_a_line_per_sample_and_a_summary() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let extra = format!(
        "[store]\nurl = \"sqlite://{}\"\n",
        dir.path().join("spans.db").display()
    );
    let cfg = config(&[mock.url()], &extra);
    let store = tito::store::open(&cfg.store.url).expect("store");
    let g = start_gateway_on(cfg, chatml_renderer(), store.clone()).await;
    for tid in ["c-1", "c-2"] {
        mock.push(reply(&g, "hello there", None));
        mock.push(reply(&g, "and more", None));
        two_turns(&g, tid).await;
    }
    let text = format!(
        "[model]\nname = \"test-model\"\ntokenizer = \"unused\"\nmax_model_len = 512\n\
         [[backends]]\nurl = \"{}\"\nkind = \"vllm\"\n{extra}",
        mock.url()
    );
    let path = dir.path().join("config.toml");
    std::fs::write(&path, text).expect("write config");
    let path = path.to_str().expect("utf8").to_string();

    let p = path.clone();
    let out =
        tokio::task::spawn_blocking(move || tito(&["verify", "--config", &p, "--since", "0"]))
            .await
            .expect("joined");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 3, "two samples and the summary: {lines:?}");
    let tids: Vec<&str> = lines[..2]
        .iter()
        .map(|l| l["trajectory_id"].as_str().expect("id"))
        .collect();
    assert_eq!(tids, ["c-1", "c-2"]);
    assert!(lines[..2].iter().all(|l| l["max_abs_diff"] == 0.0));
    let summary = &lines[2];
    assert_eq!(summary["object"], "trajectory.verify.summary");
    assert_eq!(summary["trajectories"], 2);
    assert_eq!(summary["failed"], 0);
    assert_eq!(summary["max_abs_diff"], 0.0);
    let stored = store
        .get_trajectory("c-2")
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(stored.replays.len(), 1, "the CLI stored its results");

    // One trajectory on a backend that does not exist: reported, exit 1.
    let out = tokio::task::spawn_blocking(move || {
        tito(&[
            "verify",
            "--config",
            &path,
            "--trajectory",
            "c-1",
            "--backend",
            "nope",
        ])
    })
    .await
    .expect("joined");
    assert!(!out.status.success());
    let lines = json_lines(&out);
    assert_eq!(lines.last().expect("summary")["failed"], 1);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no backend named `nope`"));
}

/// A finished trajectory is replayed on the backend that generated it, and
/// the check pins nothing: the sticky map keeps no finished trajectory.
#[tokio::test]
async fn a_check_replays_where_the_trajectory_ran_and_pins_nothing() {
    let a = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let b = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let g = start_gateway(config(&[a.url(), b.url()], "")).await;
    for t in 0..4 {
        let tid = format!("home-{t}");
        two_turns(&g, &tid).await;
        let home =
            g.get_json(&format!("/v1/trajectories/{tid}")).await["calls"][1]["backend"].clone();
        let (status, body) = verify(&g, &tid, None).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["backend"], home, "{tid}");
        assert_eq!(body["samples"][0]["max_abs_diff"], 0.0, "{tid}: {body}");
    }
    let backends = g.get_json("/admin/backends").await;
    for s in backends["backends"].as_array().expect("backends") {
        assert_eq!(s["sticky"], 0, "{backends}");
    }
}
