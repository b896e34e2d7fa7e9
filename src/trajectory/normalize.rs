//! Chat request normalization: the one place where what a client sent is
//! made into what the chat template renders. Runs before rendering on every
//! chat call, and again on stored requests when a trajectory is rebuilt from
//! the store, so both sides of history matching see the same messages.
//!
//! Each rule that changes what the model sees is named in the returned list,
//! which is recorded with the call (next to the original request):
//! - `developer_as_system`: OpenAI's `developer` role becomes `system`
//!   (templates know no `developer`; dropping it would lose the instruction);
//! - `function_as_tool`: the deprecated `function` role becomes `tool`;
//! - `text_parts_joined`: a list of text parts becomes one string, parts
//!   joined with `"\n"` as vLLM joins them, for templates that read content
//!   as a string (and for tool results without images);
//! - `assistant_content_empty`: an assistant message without content (or with
//!   `null`, a tool-call-only turn) gets `""`, which templates that test
//!   `content is string` need;
//! - `function_call_as_tool_calls`: a deprecated assistant `function_call`
//!   becomes a one-element `tool_calls` (without an id), as templates render.
//!
//! Must not: reject requests (see `api::request` for that) or touch anything
//! but `role` and `content`.

use serde_json::Value as Json;

use crate::render::ContentFormat;

/// Normalizes `messages` in place for a template reading content as
/// `format`; returns the rules that changed something, each once, in the
/// order above.
pub fn messages(messages: &mut [Json], format: ContentFormat) -> Vec<&'static str> {
    let mut applied = [false; 5];
    for m in messages.iter_mut() {
        let Some(obj) = m.as_object_mut() else {
            continue;
        };
        let role = obj.get("role").and_then(Json::as_str).unwrap_or_default();
        let new_role = match role {
            "developer" => Some(("system", 0)),
            "function" => Some(("tool", 1)),
            _ => None,
        };
        if let Some((r, rule)) = new_role {
            obj.insert("role".into(), Json::String(r.into()));
            applied[rule] = true;
        }
        let role = obj.get("role").and_then(Json::as_str).unwrap_or_default();
        let is_tool = role == "tool";
        let is_assistant = role == "assistant";
        if is_assistant && !obj.contains_key("tool_calls") {
            if let Some(f) = obj.get("function_call").filter(|f| f.is_object()).cloned() {
                // No id: the old shape has none, and history matching then
                // compares the call by name and arguments.
                let call = serde_json::json!({"type": "function", "function": f});
                obj.insert("tool_calls".into(), Json::Array(vec![call]));
                applied[4] = true;
            }
        }
        match obj.get("content") {
            Some(Json::Array(parts))
                if (is_tool || format == ContentFormat::String) && !parts.iter().any(is_image) =>
            {
                let text = join_text_parts(parts);
                obj.insert("content".into(), Json::String(text));
                applied[2] = true;
            }
            None | Some(Json::Null) if is_assistant => {
                obj.insert("content".into(), Json::String(String::new()));
                applied[3] = true;
            }
            _ => {}
        }
    }
    const NAMES: [&str; 5] = [
        "developer_as_system",
        "function_as_tool",
        "text_parts_joined",
        "assistant_content_empty",
        "function_call_as_tool_calls",
    ];
    NAMES
        .iter()
        .zip(applied)
        .filter_map(|(n, on)| on.then_some(*n))
        .collect()
}

/// A stored request's images, named `sha256:<hex>` in `image_url` parts,
/// made the checked parts the live call rendered (`api::images` made them
/// from the same bytes), from the call's recorded `images`.
pub fn stored_images(messages: &mut [Json], images: &[crate::store::CallImage]) {
    use crate::render::placeholders::{image_part, IMAGE_REF_PREFIX};
    if images.is_empty() {
        return;
    }
    let parts = messages
        .iter_mut()
        .filter_map(|m| m.get_mut("content").and_then(Json::as_array_mut))
        .flatten();
    for part in parts {
        // `{"image_url": {"url"}}`, or the string form chat also takes.
        let url = part
            .pointer("/image_url/url")
            .or_else(|| part.get("image_url").filter(|u| u.is_string()))
            .and_then(Json::as_str);
        let Some(sha) = url.and_then(|u| u.strip_prefix(IMAGE_REF_PREFIX)) else {
            continue;
        };
        if let Some(im) = images.iter().find(|im| im.sha256 == sha) {
            *part = image_part(&im.sha256, im.width, im.height);
        }
    }
}

/// An image part (`image_url`, or checked: `render::placeholders`): kept
/// in place, the template renders it.
fn is_image(part: &Json) -> bool {
    matches!(
        part.get("type").and_then(Json::as_str),
        Some("image_url") | Some(crate::render::placeholders::IMAGE_PART)
    )
}

/// The text of OpenAI content parts, joined with `"\n"`. Parts are checked
/// to be text by the request validation; any other is skipped here.
fn join_text_parts(parts: &[Json]) -> String {
    parts
        .iter()
        .filter_map(|p| p.get("text").and_then(Json::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn roles_parts_and_empty_assistant_content() {
        let mut m = vec![
            json!({"role": "developer", "content": "Always answer in French."}),
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
            json!({"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                   "function": {"name": "f", "arguments": "{}"}}]}),
            json!({"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "42"}]}),
            json!({"role": "function", "name": "f", "content": "7"}),
        ];
        let applied = messages(&mut m, ContentFormat::String);
        assert_eq!(
            applied,
            vec![
                "developer_as_system",
                "function_as_tool",
                "text_parts_joined",
                "assistant_content_empty"
            ]
        );
        assert_eq!(m[0]["role"], "system");
        assert_eq!(m[1]["content"], "a\nb");
        assert_eq!(m[2]["content"], "");
        assert_eq!(m[3]["content"], "42");
        assert_eq!(m[4]["role"], "tool");
    }

    #[test]
    fn parts_stay_parts_for_templates_that_read_them_but_tool_results_flatten() {
        let mut m = vec![
            json!({"role": "user", "content": [{"type": "text", "text": "a"}]}),
            json!({"role": "tool", "content": [{"type": "text", "text": "42"}]}),
        ];
        let applied = messages(&mut m, ContentFormat::Parts);
        assert_eq!(m[0]["content"], json!([{"type": "text", "text": "a"}]));
        assert_eq!(m[1]["content"], "42");
        assert_eq!(applied, vec!["text_parts_joined"]);
        let mut plain = vec![json!({"role": "user", "content": "x"})];
        assert!(messages(&mut plain, ContentFormat::String).is_empty());
    }
}
