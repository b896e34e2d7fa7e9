//! OpenAI request fields tito does not implement, refused by name instead of
//! ignored: a request that asks for something the answer will not honour
//! (audio, predicted outputs, a logit bias) gets a 400 naming the field.
//! A field at its neutral value (`null`, `"text"`, `{}`, `"auto"`) is
//! accepted. Fields without effect on generation (`user`, `metadata`,
//! `store`, `service_tier`, `prompt_cache_*`, `safety_identifier`) are
//! accepted and kept with the recorded request. Fields OpenAI does not
//! define (other engines' extensions) stay ignored unless tito implements
//! them (docs/api.md lists both).

use serde_json::Value as Json;

use crate::error::ApiError;

/// A field and why a non-neutral value of it is refused. `neutral` sees the
/// value and the whole body (a value can be honoured by another field).
struct Rule {
    field: &'static str,
    neutral: fn(&Json, &Json) -> bool,
    why: &'static str,
}

fn is_null(v: &Json, _: &Json) -> bool {
    v.is_null()
}

fn null_or_empty_object(v: &Json, _: &Json) -> bool {
    v.is_null() || v.as_object().is_some_and(serde_json::Map::is_empty)
}

/// `parallel_tool_calls: false` is honoured when `tool_choice` (or the
/// legacy `function_call`) names a function: the output is then constrained
/// to exactly one call.
fn one_call_at_most(v: &Json, body: &Json) -> bool {
    v.is_null()
        || v.as_bool() == Some(true)
        || body.pointer("/tool_choice/function/name").is_some()
        || body.pointer("/function_call/name").is_some()
}

const CHAT: &[Rule] = &[
    Rule {
        field: "audio",
        neutral: is_null,
        why: "audio output is not supported: the served model is text-only",
    },
    Rule {
        field: "modalities",
        neutral: |v, _| v.is_null() || *v == serde_json::json!(["text"]),
        why: "only the `text` modality is supported",
    },
    Rule {
        field: "prediction",
        neutral: is_null,
        why: "predicted outputs are not supported",
    },
    Rule {
        field: "web_search_options",
        neutral: is_null,
        why: "web search is not supported",
    },
    Rule {
        field: "logit_bias",
        neutral: null_or_empty_object,
        why: "logit_bias is not supported",
    },
    Rule {
        field: "reasoning_effort",
        neutral: is_null,
        why: "reasoning_effort is not supported by this model's chat template (it reads no \
              reasoning_effort); templates that can switch reasoning take \
              `chat_template_kwargs` (e.g. {\"enable_thinking\": false})",
    },
    Rule {
        field: "verbosity",
        neutral: is_null,
        why: "verbosity is not supported",
    },
    Rule {
        field: "moderation",
        neutral: is_null,
        why: "moderation is not supported",
    },
    Rule {
        field: "parallel_tool_calls",
        neutral: one_call_at_most,
        why: "parallel_tool_calls: false is not supported unless tool_choice names a function: \
              the model's output is returned as sampled, with every tool call it made",
    },
];

const COMPLETIONS: &[Rule] = &[
    Rule {
        field: "logit_bias",
        neutral: null_or_empty_object,
        why: "logit_bias is not supported",
    },
    Rule {
        field: "best_of",
        neutral: |v, _| v.is_null() || v.as_f64() == Some(1.0),
        why: "best_of above 1 is not supported: ask for `n` choices",
    },
];

fn check(body: &Json, rules: &[Rule], honoured: &[&str]) -> Result<(), ApiError> {
    for rule in rules.iter().filter(|r| !honoured.contains(&r.field)) {
        if let Some(v) = body.get(rule.field) {
            if !(rule.neutral)(v, body) {
                return Err(
                    ApiError::invalid(rule.field, rule.why).with_code("unsupported_parameter")
                );
            }
        }
    }
    Ok(())
}

/// Refuses the chat fields tito does not implement; `honoured`: fields this
/// model's template implements after all (`reasoning_effort` when the
/// template reads it).
pub fn chat(body: &Json, honoured: &[&str]) -> Result<(), ApiError> {
    check(body, CHAT, honoured)
}

/// Refuses the completions fields tito does not implement.
pub fn completions(body: &Json) -> Result<(), ApiError> {
    check(body, COMPLETIONS, &[])
}
