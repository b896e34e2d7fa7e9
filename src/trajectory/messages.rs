//! Message identity: normalizing chat messages so a client's re-serialized
//! history can be matched against what tito saw and served, without relying
//! on byte equality (SDKs re-order keys, drop nulls, re-encode tool-call
//! arguments, strip reasoning).

use std::borrow::Cow;
use std::hash::{Hash, Hasher};

use serde_json::Value as Json;

/// The text of a message's content (string, or the text parts of an array);
/// a string content is borrowed, not copied.
pub fn content_text(m: &Json) -> Cow<'_, str> {
    match m.get("content") {
        Some(Json::String(s)) => Cow::Borrowed(s),
        Some(Json::Array(parts)) => Cow::Owned(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Json::as_str))
                .collect::<Vec<_>>()
                .join(""),
        ),
        _ => Cow::Borrowed(""),
    }
}

/// Removes `<think>...</think>` blocks (and an unterminated leading one).
pub fn strip_reasoning(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    loop {
        match rest.find("<think>") {
            Some(start) => {
                out.push_str(&rest[..start]);
                match rest[start..].find("</think>") {
                    Some(end) => rest = &rest[start + end + "</think>".len()..],
                    None => return out,
                }
            }
            None => {
                // A reply may start inside reasoning whose `<think>` was in the prompt.
                if let Some(end) = rest.find("</think>") {
                    if out.is_empty() {
                        rest = &rest[end + "</think>".len()..];
                        continue;
                    }
                }
                out.push_str(rest);
                return out;
            }
        }
    }
}

/// Tool-call arguments as the served-message match compares them.
#[derive(Debug, PartialEq)]
pub enum ToolArgs {
    /// Parsed, whether sent as a string or as an object (missing: null),
    /// every number as a float ([`numbers_by_value`]).
    Json(Json),
    /// A string that is not JSON, kept as sent: the text `x` is not the
    /// JSON string `"x"`.
    Text(String),
}

fn arguments_value(call: &Json) -> ToolArgs {
    let mut v = match call.pointer("/function/arguments") {
        Some(Json::String(s)) => match serde_json::from_str(s) {
            Ok(v) => v,
            Err(_) => return ToolArgs::Text(s.clone()),
        },
        Some(v) => v.clone(),
        None => Json::Null,
    };
    numbers_by_value(&mut v);
    ToolArgs::Json(v)
}

/// Every number as a float, so `1`, `1.0` and `1e0` compare equal: a client
/// that re-serializes arguments (JavaScript's `JSON.stringify` writes `1.0`
/// as `1`) echoes the same call.
fn numbers_by_value(v: &mut Json) {
    match v {
        Json::Number(n) => {
            if let Some(f) = n.as_f64().and_then(serde_json::Number::from_f64) {
                *n = f;
            }
        }
        Json::Array(items) => items.iter_mut().for_each(numbers_by_value),
        Json::Object(fields) => fields.values_mut().for_each(numbers_by_value),
        _ => {}
    }
}

/// Identity of a tool call: name and parsed arguments (ids are compared
/// separately because some clients drop them).
pub fn tool_call_key(call: &Json) -> (String, ToolArgs) {
    let name = call
        .pointer("/function/name")
        .and_then(Json::as_str)
        .unwrap_or_default()
        .to_string();
    (name, arguments_value(call))
}

fn tool_calls(m: &Json) -> &[Json] {
    m.get("tool_calls")
        .and_then(Json::as_array)
        .map_or(&[], Vec::as_slice)
}

/// Feeds a message's canonical form to `h`: role, trimmed content (its
/// reasoning stripped on an assistant message), tool call names and parsed
/// arguments, `tool_call_id`, `name`. Other keys, their order and nulls do
/// not count. The fields come in a fixed order, the optional ones tagged,
/// and each string ends in a terminator (`str`'s `Hash`), so two different
/// forms feed different bytes.
fn hash_canonical(m: &Json, h: &mut impl Hasher) {
    let role = m.get("role").and_then(Json::as_str).unwrap_or_default();
    role.hash(h);
    let text = content_text(m);
    if role == "assistant" {
        strip_reasoning(&text).trim().hash(h);
    } else {
        text.trim().hash(h);
    }
    let calls = tool_calls(m);
    calls.len().hash(h);
    for c in calls {
        let (name, args) = tool_call_key(c);
        name.hash(h);
        match &args {
            ToolArgs::Json(v) => hash_value(v, h),
            // A tag no JSON value starts with.
            ToolArgs::Text(s) => (6u8, s).hash(h),
        }
    }
    for key in ["tool_call_id", "name"] {
        // `Option`'s hash tags `None` and `Some` apart.
        m.get(key).and_then(Json::as_str).hash(h);
    }
}

/// Heap bytes below a JSON value (its own inline size not counted), as
/// serde_json with `preserve_order` allocates them: string capacities, an
/// array's slots, and each object's entries and index table
/// ([`object_table_bytes`]). What the hot view and the retry cache count
/// against their byte budgets; checked against a counting allocator in
/// `tests/trajectory_hot_bytes.rs`.
pub fn json_heap_bytes(v: &Json) -> usize {
    match v {
        Json::String(s) => s.capacity(),
        Json::Array(items) => {
            items.capacity() * std::mem::size_of::<Json>()
                + items.iter().map(json_heap_bytes).sum::<usize>()
        }
        Json::Object(fields) => {
            object_table_bytes(fields.len())
                + fields
                    .iter()
                    .map(|(k, v)| k.capacity() + json_heap_bytes(v))
                    .sum::<usize>()
        }
        _ => 0,
    }
}

/// The two allocations of an object of `n` fields (an `IndexMap`): its
/// entries (a hash, the key and the value each) grown to the capacity of
/// its index table, a hashbrown table of `usize` positions with a control
/// byte per bucket and one group of 16 more. Hashbrown sizes a table of
/// fewer than 8 buckets to hold one less than its buckets, a larger one to
/// 7/8 of them, always a power of two and at least 4.
fn object_table_bytes(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let buckets = match n {
        1..=3 => 4,
        4..=7 => 8,
        _ => (n * 8).div_ceil(7).next_power_of_two(),
    };
    let capacity = if buckets < 8 {
        buckets - 1
    } else {
        buckets / 8 * 7
    };
    let entry =
        std::mem::size_of::<u64>() + std::mem::size_of::<String>() + std::mem::size_of::<Json>();
    capacity * entry + buckets * (std::mem::size_of::<usize>() + 1) + 16
}

/// What a render of `messages` (and the `tools` the template lists) has to
/// go through, in bytes: every string in them (content and its parts, tool
/// calls' arguments, tool schemas) plus a little per node. Decides whether
/// the render runs off the async worker ([`crate::render::run_render_work`]).
pub fn render_bytes(messages: &[Json], tools: Option<&[Json]>) -> usize {
    messages.iter().map(json_bytes).sum::<usize>()
        + tools.map_or(0, |t| t.iter().map(json_bytes).sum())
}

/// Rough heap bytes of a JSON value: its strings and keys plus a node
/// overhead.
pub fn json_bytes(v: &Json) -> usize {
    const NODE: usize = 32;
    NODE + match v {
        Json::String(s) => s.len(),
        Json::Array(a) => a.iter().map(json_bytes).sum(),
        Json::Object(o) => o.iter().map(|(k, v)| k.len() + json_bytes(v)).sum(),
        _ => 0,
    }
}

/// What a render depends on besides the messages: the tools' function
/// definitions (from `tools`, or the legacy `functions`) and the template's
/// kwargs. A call continues another only in the same context: the prefix
/// it reuses was rendered with the other's tools (and, e.g., its reasoning
/// effort), so a changed context starts a new sample (with a
/// `context_change` drift event).
#[derive(Default, Clone, Copy)]
pub struct RenderContext<'a> {
    pub tools: Option<&'a [Json]>,
    /// Legacy `functions`: bare function definitions.
    pub functions: Option<&'a [Json]>,
    pub kwargs: Option<&'a serde_json::Map<String, Json>>,
}

impl<'a> RenderContext<'a> {
    /// The context a stored request was rendered in.
    pub fn of_request(request: &'a Json) -> Self {
        RenderContext {
            tools: request
                .get("tools")
                .and_then(Json::as_array)
                .map(Vec::as_slice),
            functions: request
                .get("functions")
                .and_then(Json::as_array)
                .map(Vec::as_slice),
            kwargs: request
                .get("chat_template_kwargs")
                .and_then(Json::as_object),
        }
    }

    /// The hashes of this context's two parts.
    pub fn hash(&self) -> ContextHash {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let tools = self.tools.unwrap_or_default().iter();
        let defs = tools.map(|t| t.get("function").unwrap_or(t));
        for f in defs.chain(self.functions.unwrap_or_default()) {
            f.to_string().hash(&mut h);
        }
        let tools = h.finish();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for (key, v) in self.kwargs.into_iter().flatten() {
            key.hash(&mut h);
            v.to_string().hash(&mut h);
        }
        ContextHash {
            tools,
            kwargs: h.finish(),
        }
    }
}

/// A [`RenderContext`], hashed: the function definitions (from `tools` or
/// the legacy `functions`, which render alike) and the template kwargs (an
/// empty map is none).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ContextHash {
    pub tools: u64,
    pub kwargs: u64,
}

impl ContextHash {
    /// The request fields whose change `self` -> `now` shows.
    pub fn changed(self, now: ContextHash) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.tools != now.tools {
            out.push("tools");
        }
        if self.kwargs != now.kwargs {
            out.push("chat_template_kwargs");
        }
        out
    }
}

/// Feeds a JSON value to `h` with object keys in sorted order, so that two
/// values `==` calls equal (it ignores key order) feed the same bytes. Each
/// value is tagged with its kind; arrays and objects with their length.
fn hash_value(v: &Json, h: &mut impl Hasher) {
    match v {
        Json::Null => 0u8.hash(h),
        Json::Bool(b) => (1u8, b).hash(h),
        Json::Number(n) => (2u8, n.to_string()).hash(h),
        Json::String(s) => (3u8, s).hash(h),
        Json::Array(items) => {
            4u8.hash(h);
            items.len().hash(h);
            items.iter().for_each(|x| hash_value(x, h));
        }
        Json::Object(fields) => {
            5u8.hash(h);
            fields.len().hash(h);
            let mut sorted: Vec<_> = fields.iter().collect();
            sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
            for (k, x) in sorted {
                k.hash(h);
                hash_value(x, h);
            }
        }
    }
}

/// Hashes of every prefix of `messages`: `out[i]` covers `messages[..i]`.
/// In-process only (the hot view rebuilds them from the store): never
/// persist them or compare them across builds.
pub fn prefix_hashes(messages: &[Json]) -> Vec<u64> {
    let mut h = PrefixHasher::default();
    let mut out = Vec::with_capacity(messages.len() + 1);
    out.push(h.finish());
    for m in messages {
        h.push(m);
        out.push(h.finish());
    }
    out
}

/// The running hash behind [`prefix_hashes`]: after `push`ing a list's
/// messages, `finish` is that list's last prefix hash. A clone continues
/// it over a longer list.
#[derive(Clone, Default)]
pub struct PrefixHasher(std::collections::hash_map::DefaultHasher);

impl PrefixHasher {
    pub fn push(&mut self, message: &Json) {
        hash_canonical(message, &mut self.0);
    }

    pub fn finish(&self) -> u64 {
        self.0.finish()
    }
}

/// Whether the client's echo of an assistant message is the one tito served.
/// Tool calls match by name + arguments (parsed), and by id when both have
/// ids;
/// content matches after stripping reasoning and surrounding whitespace.
pub fn is_served_message(echo: &Json, served: &Json) -> bool {
    if echo.get("role").and_then(Json::as_str) != Some("assistant") {
        return false;
    }
    let (a, b) = (tool_calls(echo), tool_calls(served));
    if a.len() != b.len() {
        return false;
    }
    for (x, y) in a.iter().zip(b) {
        let ids = (
            x.get("id").and_then(Json::as_str),
            y.get("id").and_then(Json::as_str),
        );
        // An id kept on an edited call (LangGraph's "edit tool call") is
        // not the served call: the name and arguments must match too.
        let same_id = match ids {
            (Some(i), Some(j)) => i == j,
            _ => true,
        };
        let same = same_id && tool_call_key(x) == tool_call_key(y);
        if !same {
            return false;
        }
    }
    let echo_text = strip_reasoning(&content_text(echo));
    let served_text = strip_reasoning(&content_text(served));
    echo_text.trim() == served_text.trim()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Content parts, tool-call arguments and tool schemas all count toward
    /// the size that sends a render off the async worker.
    #[test]
    fn render_bytes_counts_parts_tool_calls_and_tools() {
        let big = "x".repeat(70_000);
        let parts = [json!({"role": "user", "content": [{"type": "text", "text": big}]})];
        let call = [
            json!({"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
            "function": {"name": "f", "arguments": big}}]}),
        ];
        let small = [json!({"role": "user", "content": "hi"})];
        let tools = [json!({"type": "function", "function": {"name": "f",
            "parameters": {"type": "object", "description": big}}})];
        let over = crate::render::LARGE_RENDER_BYTES;
        assert!(render_bytes(&parts, None) > over);
        assert!(render_bytes(&call, None) > over);
        assert!(render_bytes(&small, Some(&tools)) > over);
        assert!(render_bytes(&small, None) < 1024);
    }

    #[test]
    fn reasoning_is_stripped() {
        assert_eq!(
            strip_reasoning("<think>hmm</think>\n\nAnswer"),
            "\n\nAnswer"
        );
        assert_eq!(strip_reasoning("hmm</think>Answer"), "Answer");
        assert_eq!(strip_reasoning("plain"), "plain");
    }

    #[test]
    fn reserialized_tool_calls_still_match() {
        let served = json!({"role": "assistant", "content": "",
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":1,  \"b\": 2}"}}]});
        let echo = json!({"content": null, "role": "assistant",
            "tool_calls": [{"type": "function", "id": "call_1", "function": {"arguments": "{\"b\": 2, \"a\": 1}", "name": "add"}}]});
        assert!(is_served_message(&echo, &served));
        let no_ids = json!({"role": "assistant",
            "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]});
        assert!(is_served_message(&no_ids, &served));
        let edited = json!({"role": "assistant", "content": "",
            "tool_calls": [{"function": {"name": "add", "arguments": "{\"a\": 5}"}}]});
        assert!(!is_served_message(&edited, &served));
        // Edited in place, its id kept (LangGraph's human-in-the-loop edit).
        let edited_same_id = json!({"role": "assistant", "content": "",
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "add", "arguments": "{\"a\": 5, \"b\": 2}"}}]});
        assert!(!is_served_message(&edited_same_id, &served));
        let renamed_same_id = json!({"role": "assistant", "content": "",
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "sub", "arguments": "{\"a\": 1, \"b\": 2}"}}]});
        assert!(!is_served_message(&renamed_same_id, &served));
        // Re-serialized by JavaScript: 1.0 comes back as 1.
        let float = json!({"role": "assistant", "content": "",
            "tool_calls": [{"id": "c", "type": "function",
                            "function": {"name": "f", "arguments": "{\"x\": 1.0, \"y\": [2e0]}"}}]});
        let echoed = json!({"role": "assistant",
            "tool_calls": [{"id": "c", "type": "function",
                            "function": {"name": "f", "arguments": "{\"x\":1,\"y\":[2]}"}}]});
        assert!(is_served_message(&echoed, &float));
        // Arguments the model wrote as non-JSON text match only that text:
        // the JSON string of the same characters is another call.
        let text = |args: &str| {
            json!({"role": "assistant",
                "tool_calls": [{"id": "c", "type": "function",
                                "function": {"name": "f", "arguments": args}}]})
        };
        assert!(is_served_message(&text("x"), &text("x")));
        assert!(!is_served_message(&text("\"x\""), &text("x")));
        assert!(!is_served_message(&text("x"), &text("\"x\"")));
    }

    #[test]
    fn content_matches_modulo_reasoning_and_whitespace() {
        let served = json!({"role": "assistant", "content": "<think>x</think>\n\nHi there "});
        assert!(is_served_message(
            &json!({"role": "assistant", "content": "Hi there"}),
            &served
        ));
        assert!(!is_served_message(
            &json!({"role": "assistant", "content": "Hi there!"}),
            &served
        ));
        assert!(!is_served_message(
            &json!({"role": "user", "content": "Hi there"}),
            &served
        ));
    }

    #[test]
    fn prefix_hashes_ignore_key_order_and_nulls() {
        let a = vec![json!({"role": "user", "content": "hi", "name": null})];
        let b = vec![json!({"content": "hi", "role": "user"})];
        assert_eq!(prefix_hashes(&a), prefix_hashes(&b));
        let c = vec![json!({"role": "user", "content": "hi!"})];
        assert_ne!(prefix_hashes(&a)[1], prefix_hashes(&c)[1]);
    }

    /// What counts in a message's hash, and what does not.
    #[test]
    fn prefix_hashes_see_the_canonical_form_only() {
        let h = |m: Json| prefix_hashes(&[m])[1];
        let call_as = |id: &str, name: &str, args: Json| {
            let function = json!({"name": name, "arguments": args});
            json!({"id": id, "type": "function", "function": function})
        };
        let call = |name: &str, args: &str| call_as("c1", name, json!(args));
        let calls = |c: Vec<Json>| h(json!({"role": "assistant", "content": "", "tool_calls": c}));
        // Same canonical form.
        let parts = json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b "}]);
        assert_eq!(
            h(json!({"role": "user", "content": parts})),
            h(json!({"role": "user", "content": "ab"}))
        );
        assert_eq!(
            h(json!({"role": "assistant", "content": "<think>x</think> ok"})),
            h(json!({"role": "assistant", "content": "ok"}))
        );
        let with_null =
            json!({"role": "assistant", "content": null, "tool_calls": [call("f", "{}")]});
        assert_eq!(h(with_null), calls(vec![call("f", "{}")]));
        // A tool call's id does not count; its arguments count by value
        // (a JSON string or an object, 1 or 1.0).
        assert_eq!(
            calls(vec![call_as("c1", "f", json!("{\"a\": 1}"))]),
            calls(vec![call_as("c9", "f", json!({"a": 1.0}))])
        );
        // ... and their keys in any order, at any depth.
        assert_eq!(
            calls(vec![call(
                "f",
                "{\"a\": 1, \"b\": {\"x\": [1, {\"p\": 0, \"q\": 1}], \"y\": null}}"
            )]),
            calls(vec![call(
                "f",
                "{\"b\": {\"y\": null, \"x\": [1, {\"q\": 1, \"p\": 0}]}, \"a\": 1}"
            )])
        );
        // Different canonical forms.
        let base = json!({"role": "tool", "content": "r", "tool_call_id": "c1"});
        for other in [
            json!({"role": "tool", "content": "r", "tool_call_id": "c2"}),
            json!({"role": "tool", "content": "r"}),
            json!({"role": "tool", "content": "r", "tool_call_id": "c1", "name": "f"}),
            json!({"role": "user", "content": "r", "tool_call_id": "c1"}),
            json!({"role": "tool", "content": "<think>x</think>r", "tool_call_id": "c1"}),
        ] {
            assert_ne!(h(base.clone()), h(other.clone()), "{other}");
        }
        assert_ne!(
            h(json!({"role": "tool", "content": "r", "tool_call_id": "x"})),
            h(json!({"role": "tool", "content": "r", "name": "x"})),
            "one string as tool_call_id and as name"
        );
        assert_ne!(
            h(json!({"role": "tool", "content": "r", "tool_call_id": ""})),
            h(json!({"role": "tool", "content": "r"})),
            "an empty tool_call_id and none"
        );
        let one = || vec![call("f", "{}")];
        assert_ne!(calls(one()), calls(vec![call("g", "{}")]));
        assert_ne!(calls(one()), calls(vec![call("f", "{\"a\": 1}")]));
        assert_ne!(calls(one()), calls(vec![call("f", "{}"), call("f", "{}")]));
        assert_ne!(calls(vec![]), calls(vec![call("", "{}")]));
        for (x, y) in [
            ("{\"a\": [1, 2]}", "{\"a\": [2, 1]}"),
            ("{\"a\": 1}", "{\"a\": \"1\"}"),
            ("{\"a\": null}", "{}"),
            ("{\"a\": [[]]}", "{\"a\": [[], []]}"),
            ("{\"a\": {\"b\": 1}}", "{\"a\": {\"b\": 1}, \"b\": 1}"),
            ("[true]", "[false]"),
            // Arguments that are not JSON are text, not a JSON string.
            ("x", "\"x\""),
            ("x", "\"\\\"x\\\"\""),
        ] {
            assert_ne!(
                calls(vec![call("f", x)]),
                calls(vec![call("f", y)]),
                "{x} {y}"
            );
        }
    }
}
