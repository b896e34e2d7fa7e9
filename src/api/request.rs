//! OpenAI request bodies: strict on types, lenient on unknown fields.
//!
//! Bodies are read as JSON values first (malformed JSON → 400), then
//! deserialized with the failing field's path in the message, then validated
//! into [`SamplingParams`]. Nothing here panics on input.

use axum::body::Bytes;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value as Json;

use crate::backend::{SamplingParams, StructuredOutput};
use crate::error::ApiError;

/// Request types that carry the shared sampling fields.
pub trait WithSampling {
    fn set_sampling(&mut self, sampling: SamplingFields);
}

/// Parses a request body into `T` plus its sampling fields, naming the
/// offending field on error. (Sampling fields are read in a second pass over
/// the same JSON value: `#[serde(flatten)]` would lose the error's path.)
/// Also returns the body's JSON value, which the span record keeps, so the
/// body is parsed once.
pub fn parse_body<T: DeserializeOwned + WithSampling>(body: &Bytes) -> Result<(T, Json), ApiError> {
    let value = parse_json(body)?;
    let mut req: T = from_json(&value)?;
    req.set_sampling(from_json(&value)?);
    Ok((req, value))
}

/// Reads a request already parsed as JSON (a surface's translation) into
/// `T` plus its sampling fields, naming the offending field on error.
pub fn parse_value<T: DeserializeOwned + WithSampling>(value: &Json) -> Result<T, ApiError> {
    let mut req: T = from_json(value)?;
    req.set_sampling(from_json(value)?);
    Ok(req)
}

/// The body as a JSON object: malformed JSON, or another value, is a 400.
pub fn parse_json(body: &Bytes) -> Result<Json, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request(
            "request body is empty; expected a JSON object",
        ));
    }
    let value: Json = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request("request body must be a JSON object"));
    }
    Ok(value)
}

/// Deserializes with the failing field's path in the error.
pub fn from_value<T: DeserializeOwned>(value: Json) -> Result<T, ApiError> {
    from_json(&value)
}

fn from_json<T: DeserializeOwned>(value: &Json) -> Result<T, ApiError> {
    // A plain pass first: tracking every field's path costs about as much
    // as the pass itself, and only an error reads it.
    if let Ok(v) = T::deserialize(value) {
        return Ok(v);
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || path.is_empty() {
            ApiError::bad_request(inner.to_string())
        } else {
            ApiError::invalid(&path, format!("invalid `{path}`: {inner}"))
        }
    })
}

/// `stop`: a string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling fields shared by chat and completions (vLLM extensions included).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SamplingFields {
    #[serde(default, deserialize_with = "lenient::int")]
    pub max_tokens: Option<u32>,
    #[serde(default, deserialize_with = "lenient::int")]
    pub max_completion_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    #[serde(default, deserialize_with = "lenient::int")]
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    #[serde(default, deserialize_with = "lenient::int")]
    pub seed: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub stop: Option<StopSpec>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub ignore_eos: Option<bool>,
    #[serde(default, deserialize_with = "lenient::int")]
    pub n: Option<u32>,
}

pub const MAX_N: u32 = 64;
pub const MAX_STOP_STRINGS: usize = 16;
/// Longest stop string, in bytes.
pub const MAX_STOP_BYTES: usize = 1024;
pub const MAX_STOP_TOKEN_IDS: usize = 256;
pub const MAX_TOP_LOGPROBS: u32 = 20;

impl SamplingFields {
    /// Validates and converts; `max_tokens` is resolved later against the
    /// context window, so it is returned separately.
    pub fn validate(
        &self,
        logprobs: Option<u32>,
        vocab_size: u32,
    ) -> Result<(SamplingParams, Option<u32>), ApiError> {
        fn range(param: &str, v: Option<f32>, lo: f32, hi: f32) -> Result<Option<f32>, ApiError> {
            match v {
                Some(x) if !x.is_finite() || x < lo || x > hi => Err(ApiError::invalid(
                    param,
                    format!("`{param}` must be between {lo} and {hi}, got {x}"),
                )),
                other => Ok(other),
            }
        }
        let temperature = range("temperature", self.temperature, 0.0, 2.0)?;
        // OpenAI allows `top_p: 0` (keep only the most likely token); the
        // backends want it positive: the smallest positive value does that.
        let top_p = range("top_p", self.top_p, 0.0, 1.0)?.map(|p| p.max(f32::MIN_POSITIVE));
        let min_p = range("min_p", self.min_p, 0.0, 1.0)?;
        let presence_penalty = range("presence_penalty", self.presence_penalty, -2.0, 2.0)?;
        let frequency_penalty = range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?;
        let repetition_penalty = range("repetition_penalty", self.repetition_penalty, 0.0, 10.0)?;
        if repetition_penalty == Some(0.0) {
            return Err(ApiError::invalid(
                "repetition_penalty",
                "`repetition_penalty` must be greater than 0",
            ));
        }
        if let Some(k) = self.top_k {
            if k == 0 || k < -1 {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("`top_k` must be -1 (disabled) or at least 1, got {k}"),
                ));
            }
        }
        // Any 64-bit signed seed, sent as given: vLLM takes the i64 range.
        let seed = self.seed;
        let stop = match &self.stop {
            None => Vec::new(),
            Some(StopSpec::One(s)) => vec![s.clone()],
            Some(StopSpec::Many(v)) => v.clone(),
        };
        if stop.len() > MAX_STOP_STRINGS {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "at most {MAX_STOP_STRINGS} stop strings are allowed, got {}",
                    stop.len()
                ),
            ));
        }
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid("stop", "stop strings must not be empty"));
        }
        if let Some(long) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "a stop string is at most {MAX_STOP_BYTES} bytes, got one of {}",
                    long.len()
                ),
            ));
        }
        let mut stop_token_ids = self.stop_token_ids.clone().unwrap_or_default();
        if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
            return Err(ApiError::invalid(
                "stop_token_ids",
                format!(
                    "at most {MAX_STOP_TOKEN_IDS} stop token ids are allowed, got {}",
                    stop_token_ids.len()
                ),
            ));
        }
        if let Some(bad) = stop_token_ids.iter().find(|id| **id >= vocab_size) {
            return Err(ApiError::invalid(
                "stop_token_ids",
                format!("stop token id {bad} is out of range (vocabulary size {vocab_size})"),
            ));
        }
        stop_token_ids.sort_unstable();
        stop_token_ids.dedup();
        let max_tokens = self.max_completion_tokens.or(self.max_tokens);
        if max_tokens == Some(0) {
            let param = if self.max_completion_tokens.is_some() {
                "max_completion_tokens"
            } else {
                "max_tokens"
            };
            return Err(ApiError::invalid(
                param,
                format!("`{param}` must be at least 1"),
            ));
        }
        let params = SamplingParams {
            structured: None,
            max_tokens: 0,
            temperature,
            top_p,
            top_k: self.top_k,
            min_p,
            seed,
            presence_penalty,
            frequency_penalty,
            repetition_penalty,
            stop,
            stop_token_ids,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            logprobs,
        };
        Ok((params, max_tokens))
    }

    pub fn n(&self) -> Result<u32, ApiError> {
        match self.n.unwrap_or(1) {
            0 => Err(ApiError::invalid("n", "`n` must be at least 1")),
            n if n > MAX_N => Err(ApiError::invalid(
                "n",
                format!("`n` must be at most {MAX_N}, got {n}"),
            )),
            n => Ok(n),
        }
    }
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<Json>,
    #[serde(skip)]
    pub sampling: SamplingFields,
    #[serde(default, deserialize_with = "lenient::flag")]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    #[serde(default, deserialize_with = "lenient::flag")]
    pub logprobs: bool,
    #[serde(default, deserialize_with = "lenient::int")]
    pub top_logprobs: Option<u32>,
    pub tools: Option<Vec<Json>>,
    pub tool_choice: Option<Json>,
    pub response_format: Option<Json>,
    pub parallel_tool_calls: Option<bool>,
    pub chat_template_kwargs: Option<serde_json::Map<String, Json>>,
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    #[serde(default, deserialize_with = "lenient::flag")]
    pub return_token_ids: bool,
    pub skip_special_tokens: Option<bool>,
    pub trajectory_id: Option<String>,
    pub trajectory_group: Option<String>,
    pub trajectory_metadata: Option<crate::store::TrajectoryMetadata>,
    /// Deprecated OpenAI function calling, mapped onto `tools` / `tool_choice`
    /// by [`ChatRequest::map_legacy_functions`].
    pub functions: Option<Vec<Json>>,
    pub function_call: Option<Json>,
}

impl WithSampling for ChatRequest {
    fn set_sampling(&mut self, sampling: SamplingFields) {
        self.sampling = sampling;
    }
}

impl WithSampling for CompletionRequest {
    fn set_sampling(&mut self, sampling: SamplingFields) {
        self.sampling = sampling;
    }
}

impl ChatRequest {
    /// Structural checks the type system does not express.
    pub fn check(&self) -> Result<(), ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid(
                "messages",
                "`messages` must not be empty",
            ));
        }
        for (i, m) in self.messages.iter().enumerate() {
            let param = format!("messages[{i}]");
            let obj = m
                .as_object()
                .ok_or_else(|| ApiError::invalid(&param, format!("`{param}` must be an object")))?;
            let role = obj.get("role").and_then(Json::as_str).ok_or_else(|| {
                ApiError::invalid(
                    &format!("{param}.role"),
                    format!("`{param}.role` must be a string"),
                )
            })?;
            if ![
                "system",
                "developer",
                "user",
                "assistant",
                "tool",
                "function",
            ]
            .contains(&role)
            {
                return Err(ApiError::invalid(
                    &format!("{param}.role"),
                    format!("unknown role `{role}` in `{param}`"),
                ));
            }
            match obj.get("content") {
                None | Some(Json::Null) | Some(Json::String(_)) => {}
                Some(Json::Array(parts)) => super::images::check_parts(&param, role, parts)?,
                Some(_) => {
                    return Err(ApiError::invalid(
                        &format!("{param}.content"),
                        format!("`{param}.content` must be a string, an array of parts, or null"),
                    ))
                }
            }
        }
        if let Some(tools) = &self.tools {
            for (i, t) in tools.iter().enumerate() {
                if t.pointer("/function/name").and_then(Json::as_str).is_none() {
                    return Err(ApiError::invalid(
                        &format!("tools[{i}]"),
                        format!("`tools[{i}]` must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
                    ));
                }
            }
        }
        if self.continue_final_message == Some(true) && self.add_generation_prompt == Some(true) {
            return Err(ApiError::bad_request(
                "`continue_final_message` and `add_generation_prompt` cannot both be true",
            ));
        }
        Ok(())
    }

    /// OpenAI's `response_format` as an output constraint: `text` (or none)
    /// is none; `json_object` any JSON object; `json_schema` its `schema`.
    pub fn structured(&self) -> Result<Option<StructuredOutput>, ApiError> {
        let Some(rf) = self.response_format.as_ref().filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        match rf.get("type").and_then(Json::as_str) {
            Some("text") => Ok(None),
            Some("json_object") => Ok(Some(StructuredOutput::JsonObject)),
            Some("json_schema") => match rf.pointer("/json_schema/schema") {
                Some(schema) if schema.is_object() => {
                    Ok(Some(StructuredOutput::JsonSchema(schema.clone())))
                }
                _ => Err(ApiError::invalid(
                    "response_format.json_schema.schema",
                    "`response_format.json_schema.schema` must be a JSON Schema object",
                )),
            },
            other => Err(ApiError::invalid(
                "response_format.type",
                format!(
                    "`response_format.type` must be text, json_object or json_schema, got {}",
                    other.unwrap_or("nothing")
                ),
            )),
        }
    }

    /// Maps the deprecated `functions` / `function_call` onto `tools` /
    /// `tool_choice`; true when the request used them (its answer then
    /// speaks `function_call` too, see `api::chat`).
    pub fn map_legacy_functions(&mut self) -> Result<bool, ApiError> {
        let Some(functions) = self.functions.take() else {
            if self.function_call.as_ref().is_some_and(|f| !f.is_null()) {
                return Err(ApiError::invalid(
                    "function_call",
                    "`function_call` needs `functions`",
                ));
            }
            return Ok(false);
        };
        if self.tools.is_some() || self.tool_choice.is_some() {
            return Err(ApiError::invalid(
                "functions",
                "send either `functions` / `function_call` or `tools` / `tool_choice`",
            ));
        }
        self.tools = Some(
            functions
                .into_iter()
                .map(|f| serde_json::json!({"type": "function", "function": f}))
                .collect(),
        );
        self.tool_choice = match self.function_call.take() {
            None | Some(Json::Null) => None,
            Some(Json::String(s)) if s == "auto" || s == "none" => Some(Json::String(s)),
            Some(Json::Object(o)) => match o.get("name").and_then(Json::as_str) {
                Some(name) => {
                    Some(serde_json::json!({"type": "function", "function": {"name": name}}))
                }
                None => {
                    return Err(ApiError::invalid(
                        "function_call",
                        "`function_call` must be \"auto\", \"none\" or {\"name\": ...}",
                    ))
                }
            },
            Some(other) => {
                return Err(ApiError::invalid(
                    "function_call",
                    format!(
                    "`function_call` must be \"auto\", \"none\" or {{\"name\": ...}}, got {other}"
                ),
                ))
            }
        };
        Ok(true)
    }

    /// A `tool_choice` that forces a call: `"required"` (any of the tools) or
    /// `{"type": "function", "function": {"name": N}}`. Returns the JSON
    /// Schema the output is constrained to and the forced name, if one;
    /// `"auto"` / `"none"` / absent force nothing.
    pub fn forced_tools(&self) -> Result<Option<(Json, Option<String>)>, ApiError> {
        let tools = self.tools.as_deref().unwrap_or_default();
        let params_of = |t: &Json| {
            t.pointer("/function/parameters")
                .cloned()
                .unwrap_or_else(|| serde_json::json!({"type": "object"}))
        };
        let forced = match self.tool_choice.as_ref() {
            None | Some(Json::Null) => return Ok(None),
            Some(Json::String(s)) if s == "auto" || s == "none" => return Ok(None),
            Some(Json::String(s)) if s == "required" => {
                if tools.is_empty() {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        "`tool_choice: \"required\"` needs `tools`",
                    ));
                }
                let one_of: Vec<Json> = tools
                    .iter()
                    .map(|t| {
                        let name = t.pointer("/function/name").cloned().unwrap_or(Json::Null);
                        serde_json::json!({"type": "object", "properties": {
                            "name": {"type": "string", "enum": [name]},
                            "parameters": params_of(t)},
                            "required": ["name", "parameters"]})
                    })
                    .collect();
                let schema = serde_json::json!({"type": "array", "minItems": 1,
                                                "items": {"anyOf": one_of}});
                (schema, None)
            }
            Some(v @ Json::Object(_)) => {
                let name = v.pointer("/function/name").and_then(Json::as_str).ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice",
                        "`tool_choice` must be \"auto\", \"none\", \"required\" or \
                         {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    )
                })?;
                let tool = tools
                    .iter()
                    .find(|t| t.pointer("/function/name").and_then(Json::as_str) == Some(name))
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "tool_choice.function.name",
                            format!("`tool_choice` names `{name}`, which is not among `tools`"),
                        )
                    })?;
                (params_of(tool), Some(name.to_string()))
            }
            Some(other) => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("`tool_choice` must be \"auto\", \"none\", \"required\" or a named function, got {other}"),
                ))
            }
        };
        if self
            .response_format
            .as_ref()
            .is_some_and(|r| !r.is_null() && r.get("type").and_then(Json::as_str) != Some("text"))
        {
            return Err(ApiError::invalid(
                "response_format",
                "a forced `tool_choice` and a JSON `response_format` cannot be combined",
            ));
        }
        Ok(Some(forced))
    }

    /// `Some(k)` when logprobs are asked for.
    pub fn logprobs_k(&self) -> Result<Option<u32>, ApiError> {
        match (self.logprobs, self.top_logprobs) {
            (_, Some(k)) if k > MAX_TOP_LOGPROBS => Err(ApiError::invalid(
                "top_logprobs",
                format!("`top_logprobs` must be at most {MAX_TOP_LOGPROBS}, got {k}"),
            )),
            (false, Some(k)) if k > 0 => Err(ApiError::invalid(
                "top_logprobs",
                "`top_logprobs` requires `logprobs: true`",
            )),
            (true, k) => Ok(Some(k.unwrap_or(0))),
            (false, _) => Ok(None),
        }
    }
}

/// A completions prompt: text, or token ids passed through untouched.
#[derive(Debug, Clone)]
pub enum PromptSpec {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

impl<'de> Deserialize<'de> for PromptSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        const WANT: &str = "expected a string, a list of strings, a list of token ids \
            (integers from 0), or a list of such lists";
        let v = Json::deserialize(d)?;
        let parsed = match &v {
            Json::String(s) => Some(PromptSpec::Text(s.clone())),
            Json::Array(items) if items.iter().all(Json::is_string) => Some(PromptSpec::Texts(
                items
                    .iter()
                    .filter_map(Json::as_str)
                    .map(str::to_string)
                    .collect(),
            )),
            Json::Array(_) => serde_json::from_value(v.clone())
                .map(PromptSpec::Ids)
                .or_else(|_| serde_json::from_value(v.clone()).map(PromptSpec::IdLists))
                .ok(),
            _ => None,
        };
        parsed.ok_or_else(|| D::Error::custom(WANT))
    }
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    /// `null` reads as absent, and is refused by [`CompletionRequest::check`].
    #[serde(default)]
    pub prompt: Option<PromptSpec>,
    #[serde(skip)]
    pub sampling: SamplingFields,
    #[serde(default, deserialize_with = "lenient::flag")]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    /// Legacy completions: an int asks for that many top alternatives.
    #[serde(default, deserialize_with = "lenient::int")]
    pub logprobs: Option<u32>,
    #[serde(default, deserialize_with = "lenient::flag")]
    pub echo: bool,
    pub suffix: Option<String>,
    #[serde(default, deserialize_with = "lenient::flag")]
    pub return_token_ids: bool,
    pub skip_special_tokens: Option<bool>,
    pub add_special_tokens: Option<bool>,
    pub trajectory_id: Option<String>,
    pub trajectory_group: Option<String>,
    pub trajectory_metadata: Option<crate::store::TrajectoryMetadata>,
}

impl CompletionRequest {
    pub fn check(&self) -> Result<(), ApiError> {
        if self.prompt.is_none() {
            return Err(ApiError::invalid("prompt", "`prompt` is required"));
        }
        if self.echo {
            return Err(ApiError::invalid("echo", "`echo` is not supported")
                .with_code("unsupported_parameter"));
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid("suffix", "`suffix` is not supported")
                .with_code("unsupported_parameter"));
        }
        if let Some(k) = self.logprobs {
            if k > MAX_TOP_LOGPROBS {
                return Err(ApiError::invalid(
                    "logprobs",
                    format!("`logprobs` must be at most {MAX_TOP_LOGPROBS}, got {k}"),
                ));
            }
        }
        Ok(())
    }
}

/// Deserializers for fields where JSON Schema (and so OpenAI's spec) is more
/// permissive than serde: `null` for an optional flag, and integers written
/// as floats (`4.0` is an integer in JSON Schema).
mod lenient {
    use serde::de::{Deserializer, Error};
    use serde::Deserialize;

    pub fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
        Ok(Option::<bool>::deserialize(d)?.unwrap_or(false))
    }

    pub fn int<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: TryFrom<i64>,
    {
        let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
            return Ok(None);
        };
        let whole = if let Some(i) = n.as_i64() {
            Some(i)
        } else if let Some(f) = n.as_f64() {
            (f.fract() == 0.0 && f >= i64::MIN as f64 && f <= i64::MAX as f64).then_some(f as i64)
        } else {
            None
        };
        let whole =
            whole.ok_or_else(|| D::Error::custom(format!("expected an integer, got {n}")))?;
        T::try_from(whole)
            .map(Some)
            .map_err(|_| D::Error::custom(format!("{n} is out of range")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse<T: DeserializeOwned + WithSampling>(s: &str) -> Result<T, ApiError> {
        parse_body(&Bytes::from(s.to_string())).map(|(req, _)| req)
    }

    #[test]
    fn malformed_and_wrong_types_name_the_problem() {
        let e = parse::<ChatRequest>("{\"messages\": [").expect_err("malformed");
        assert!(e.message.contains("malformed JSON"), "{}", e.message);
        let e =
            parse::<ChatRequest>(r#"{"messages": [], "temperature": "hot"}"#).expect_err("type");
        assert_eq!(e.param.as_deref(), Some("temperature"), "{}", e.message);
        let e = parse::<ChatRequest>(r#"{"model": "m"}"#).expect_err("missing");
        assert!(e.message.contains("messages"), "{}", e.message);
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let r: ChatRequest =
            parse(r#"{"messages": [{"role": "user", "content": "hi"}], "frobnicate": 3}"#)
                .expect("ok");
        assert!(r.check().is_ok());
    }

    /// (`top_p: 0` and negative seeds are valid OpenAI values: see
    /// `nulls_are_absent_and_integral_floats_are_integers`.)
    #[test]
    fn sampling_ranges_are_checked() {
        let bad = [
            r#"{"temperature": 3}"#,
            r#"{"top_p": 1.5}"#,
            r#"{"top_p": -0.1}"#,
            r#"{"top_k": 0}"#,
            r#"{"max_tokens": 0}"#,
            r#"{"presence_penalty": -5}"#,
            r#"{"stop": [""]}"#,
            r#"{"stop_token_ids": [1000]}"#,
        ];
        let mut bad: Vec<String> = bad.iter().map(|b| b.to_string()).collect();
        bad.push(format!(
            r#"{{"stop": ["{}"]}}"#,
            "x".repeat(MAX_STOP_BYTES + 1)
        ));
        let ids: Vec<u32> = (0..=MAX_STOP_TOKEN_IDS as u32).collect();
        bad.push(serde_json::json!({ "stop_token_ids": ids }).to_string());
        for b in &bad {
            let f: SamplingFields = serde_json::from_str(b).expect("parses");
            assert!(f.validate(None, 1000).is_err(), "{b} should be rejected");
        }
        // Duplicates are kept once.
        let f: SamplingFields =
            serde_json::from_str(r#"{"stop_token_ids": [7, 3, 7, 3]}"#).expect("parses");
        let (p, _) = f.validate(None, 1000).expect("valid");
        assert_eq!(p.stop_token_ids, [3, 7]);
        let f: SamplingFields = serde_json::from_str(
            r#"{"temperature": 0.7, "stop": "x", "max_completion_tokens": 5}"#,
        )
        .expect("ok");
        let (p, max) = f.validate(Some(2), 1000).expect("valid");
        assert_eq!(p.stop, vec!["x".to_string()]);
        assert_eq!(max, Some(5));
        assert_eq!(p.logprobs, Some(2));
    }

    #[test]
    fn message_shapes_are_checked() {
        let r: ChatRequest =
            parse(r#"{"messages": [{"role": "wizard", "content": "x"}]}"#).expect("parses");
        assert_eq!(
            r.check().expect_err("role").param.as_deref(),
            Some("messages[0].role")
        );
        let r: ChatRequest =
            parse(r#"{"messages": [{"role": "user", "content": 5}]}"#).expect("parses");
        assert!(r.check().is_err());
        let r: ChatRequest = parse(r#"{"messages": []}"#).expect("parses");
        assert!(r.check().is_err());
    }

    #[test]
    fn prompt_forms() {
        let r: CompletionRequest = parse(r#"{"prompt": [1, 2, 3]}"#).expect("ids");
        assert!(matches!(r.prompt, Some(PromptSpec::Ids(ref v)) if v == &[1, 2, 3]));
        let r: CompletionRequest = parse(r#"{"prompt": "hi"}"#).expect("text");
        assert!(matches!(r.prompt, Some(PromptSpec::Text(_))));
        let e = parse::<CompletionRequest>(r#"{"prompt": [-1]}"#).expect_err("negative id");
        assert!(e.message.contains("list of token ids"), "{}", e.message);
        assert!(!e.message.contains("PromptSpec"), "{}", e.message);
        let r: CompletionRequest = parse(r#"{"prompt": null}"#).expect("null is absent");
        assert_eq!(r.check().map_err(|e| e.param), Err(Some("prompt".into())));
    }

    #[test]
    fn nulls_are_absent_and_integral_floats_are_integers() {
        let r: ChatRequest = parse(
            r#"{"messages": [{"role": "user", "content": "x"}], "stream": null,
                "logprobs": null, "max_tokens": 4.0, "n": 2.0, "seed": -3, "top_p": 0}"#,
        )
        .expect("valid per OpenAI's schema");
        assert!(!r.stream && !r.logprobs);
        assert_eq!(r.sampling.max_tokens, Some(4));
        assert_eq!(r.sampling.n, Some(2));
        let (p, max) = r.sampling.validate(None, 1000).expect("valid");
        assert_eq!(max, Some(4));
        assert_eq!(p.seed, Some(-3));
        assert!(p.top_p.is_some_and(|t| t > 0.0 && t < 1e-30));
        assert!(parse::<ChatRequest>(r#"{"messages": [], "max_tokens": 4.5}"#).is_err());
    }
}
