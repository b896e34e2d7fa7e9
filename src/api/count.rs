//! The prompt tokens of a request as a new conversation (Messages'
//! `count_tokens`, Responses' `input_tokens`): rendered as a chat call is,
//! its images checked and expanded, nothing recorded or asked.

use super::AppState;
use crate::error::ApiError;

/// The prompt tokens `chat` (a chat request body, a surface's translation)
/// renders to with the served model's template, as a new conversation
/// ending in the assistant's turn.
pub(crate) async fn prompt_tokens(
    state: &AppState,
    chat: &serde_json::Value,
) -> Result<usize, ApiError> {
    let mut req: super::request::ChatRequest = super::request::parse_value(chat)?;
    req.check()?;
    crate::trajectory::normalize::messages(&mut req.messages, state.renderer.content_format());
    let mut received = serde_json::Value::Null;
    super::images::take(state, &mut req.messages, &mut received).await?;
    let input = crate::render::RenderInput {
        messages: &req.messages,
        tools: req.tools.as_deref(),
        add_generation_prompt: true,
        kwargs: req.chat_template_kwargs.as_ref(),
    };
    let bytes = crate::trajectory::messages::render_bytes(&req.messages, req.tools.as_deref());
    let ids = crate::render::run_render_work(bytes, || state.renderer.render_ids(&input))?;
    Ok(ids.len())
}
