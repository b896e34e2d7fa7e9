//! One agent of the soak: its calls and its trajectories.

use super::*;

/// What one call gave back: the assistant message to append, the sampled
/// token count reported in `usage`.
struct Answer {
    message: Value,
    completion_tokens: u64,
}

enum CallError {
    /// An HTTP error status, with its `Retry-After` seconds.
    Status(u16, Option<u64>, String),
    /// Connection, timeout or body errors.
    Io(String),
    /// A 200 stream that did not end with `[DONE]`, or carried an error.
    Stream(String),
}

async fn call(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    stream: bool,
) -> Result<Answer, CallError> {
    let resp = client
        .post(url)
        .json(body)
        .send()
        .await
        .map_err(|e| CallError::Io(format!("{e:#}")))?;
    let status = resp.status().as_u16();
    if status != 200 {
        let retry = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let text = resp.text().await.unwrap_or_default();
        return Err(CallError::Status(status, retry, text));
    }
    if !stream {
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| CallError::Io(format!("{e:#}")))?;
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| CallError::Stream(format!("bad JSON answer: {e}")))?;
        let m = &v["choices"][0]["message"];
        let mut message = json!({"role": "assistant", "content": m["content"]});
        if let Some(tc) = m.get("tool_calls").filter(|t| t.is_array()) {
            message["tool_calls"] = tc.clone();
        }
        let completion_tokens = v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        return Ok(Answer {
            message,
            completion_tokens,
        });
    }
    // SSE: accumulate content and tool-call deltas as the OpenAI SDK does.
    let mut content = String::new();
    let mut calls: BTreeMap<u64, Value> = BTreeMap::new();
    let mut completion_tokens = 0;
    let mut done = false;
    let mut buf: Vec<u8> = Vec::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| CallError::Io(format!("{e:#}")))?;
        buf.extend_from_slice(&chunk);
        while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim_end().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let v: Value = serde_json::from_str(data)
                .map_err(|e| CallError::Stream(format!("bad chunk {data:?}: {e}")))?;
            if v.get("error").is_some() {
                return Err(CallError::Stream(format!("error event: {data}")));
            }
            if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                completion_tokens = n;
            }
            let delta = &v["choices"][0]["delta"];
            if let Some(s) = delta["content"].as_str() {
                content.push_str(s);
            }
            for tc in delta["tool_calls"].as_array().into_iter().flatten() {
                let i = tc["index"].as_u64().unwrap_or(0);
                let e = calls.entry(i).or_insert_with(|| {
                    json!({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                });
                if let Some(id) = tc["id"].as_str() {
                    e["id"] = json!(id);
                }
                for field in ["name", "arguments"] {
                    if let Some(s) = tc["function"][field].as_str() {
                        let prev = e["function"][field].as_str().unwrap_or("").to_string();
                        e["function"][field] = json!(prev + s);
                    }
                }
            }
        }
    }
    if !done {
        return Err(CallError::Stream("stream ended without [DONE]".into()));
    }
    let mut message = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls.into_values().collect());
    }
    Ok(Answer {
        message,
        completion_tokens,
    })
}

/// One agent: trajectories back to back until `deadline`.
pub(super) async fn agent(
    agent: usize,
    client: reqwest::Client,
    base: Arc<String>,
    turns: usize,
    deadline: Instant,
    shared: Arc<Shared>,
) {
    let mut seq = 0usize;
    while Instant::now() < deadline {
        let tid = format!("soak-{agent}-{seq}");
        let stream = seq % 2 == 1;
        seq += 1;
        let url = format!("{base}/t/{tid}/v1/chat/completions");
        let mut messages = vec![
            json!({"role": "system", "content": SYSTEM}),
            json!({"role": "user", "content": format!(
                "Task {agent}.{seq}: the test suite fails on main; find out why and fix it.")}),
        ];
        let mut acked = 0u64;
        let mut tokens = 0u64;
        'turns: for turn in 0..turns {
            if Instant::now() >= deadline {
                break;
            }
            let mut body = json!({
                "model": "soak-model",
                "messages": messages,
                "tools": tools(),
                "max_tokens": 64,
                "temperature": 1.0,
            });
            if stream {
                body["stream"] = json!(true);
                body["stream_options"] = json!({"include_usage": true});
            }
            let answer = loop {
                let t0 = Instant::now();
                match call(&client, &url, &body, stream).await {
                    Ok(a) => {
                        let us = t0.elapsed().as_micros().min(u32::MAX as u128) as u32;
                        shared.calls.fetch_add(1, Ordering::Relaxed);
                        shared.window.lock().expect("lock").push(us);
                        shared.tally.lock().expect("lock").latencies_us.push(us);
                        break a;
                    }
                    Err(CallError::Status(429, retry, _)) => {
                        shared.error("429".into(), String::new());
                        // The client's backoff, as Retry-After asks.
                        let wait = Duration::from_millis(retry.unwrap_or(1).min(5) * 1000);
                        tokio::time::sleep(
                            wait.min(deadline.saturating_duration_since(Instant::now())),
                        )
                        .await;
                        if Instant::now() >= deadline {
                            break 'turns;
                        }
                    }
                    Err(CallError::Status(s, _, text)) => {
                        shared.error(s.to_string(), format!("{tid} turn {turn}: {s} {text}"));
                        break 'turns;
                    }
                    Err(CallError::Io(e)) => {
                        shared.error("io".into(), format!("{tid} turn {turn}: {e}"));
                        break 'turns;
                    }
                    Err(CallError::Stream(e)) => {
                        shared.error("stream".into(), format!("{tid} turn {turn}: {e}"));
                        break 'turns;
                    }
                }
            };
            acked += 1;
            tokens += answer.completion_tokens;
            let ids: Vec<String> = answer.message["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| c["id"].as_str().unwrap_or("").to_string())
                .collect();
            messages.push(answer.message);
            if ids.is_empty() {
                messages.push(json!({"role": "user", "content": "Go on."}));
            }
            for id in ids {
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": format!(
                    "$ pytest -q tests\n{} passed, {} failed in 0.{turn}s", 40 + turn, turns - turn)}));
            }
        }
        let finish = format!("{base}/v1/trajectories/{tid}/finish");
        let status = match client.post(&finish).json(&json!({})).send().await {
            Ok(r) => {
                let s = r.status().as_u16();
                let _ = r.bytes().await;
                s.to_string()
            }
            Err(_) => "io".to_string(),
        };
        let mut t = shared.tally.lock().expect("lock");
        if acked > 0 {
            t.acked.insert(tid, (acked, tokens));
        }
        // A trajectory with no call is unknown to the store: 404 is right.
        if status == "200" || (acked == 0 && status == "404") {
            t.trajectories_finished += 1;
        } else {
            *t.finish_errors.entry(status).or_default() += 1;
        }
    }
}
