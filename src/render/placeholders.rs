//! Images in rendered prompts: the template writes one `<|image_pad|>` per
//! image part; each is expanded here to the image's pad count, as
//! transformers' Qwen-VL processor expands the text before tokenizing
//! (`Qwen2VLProcessor.__call__` replaces the k-th image token with the k-th
//! image's `grid_t * grid_h * grid_w / merge_size^2` tokens).
//!
//! An image part, after the request layer has checked it, is
//! `{"type": "image", "image": "sha256:<hex>", "width": W, "height": H}`:
//! the template renders it (Qwen-VL templates render any part of type
//! `image`), the size decides its pad count.

use serde_json::Value as Json;

use super::vision::{ImageGrid, VisionConfig, IMAGE_PAD};
use super::RenderError;

/// The `type` of a checked image part.
pub const IMAGE_PART: &str = "image";

/// `sha256:` + the hex digest: how a checked image part, and a stored
/// request, name an image.
pub const IMAGE_REF_PREFIX: &str = "sha256:";

/// A checked image part: `{"type": "image", "image": "sha256:…", "width",
/// "height"}`.
pub fn image_part(sha256: &str, width: u32, height: u32) -> Json {
    serde_json::json!({
        "type": IMAGE_PART,
        "image": format!("{IMAGE_REF_PREFIX}{sha256}"),
        "width": width,
        "height": height,
    })
}

/// The size of a checked image part; `None` for any other part.
pub fn part_size(part: &Json) -> Option<(u32, u32)> {
    if part.get("type").and_then(Json::as_str) != Some(IMAGE_PART) {
        return None;
    }
    let side = |k: &str| {
        part.get(k)
            .and_then(Json::as_u64)
            .and_then(|v| u32::try_from(v).ok())
    };
    Some((side("width")?, side("height")?))
}

/// The checked image parts of `messages`, in order, as (width, height).
pub fn message_images(messages: &[Json]) -> impl Iterator<Item = (u32, u32)> + '_ {
    messages
        .iter()
        .filter_map(|m| m.get("content").and_then(Json::as_array))
        .flatten()
        .filter_map(part_size)
}

/// The grid of each image of `messages`, in order.
pub fn message_grids(
    vision: &VisionConfig,
    messages: &[Json],
) -> Result<Vec<ImageGrid>, RenderError> {
    message_images(messages)
        .map(|(w, h)| {
            vision
                .image_grid(u64::from(h), u64::from(w))
                .map_err(|e| RenderError::Template(e.to_string()))
        })
        .collect()
}

/// `text` with its k-th `<|image_pad|>` repeated `grids[k].pad_count`
/// times. The template must have written exactly one per image.
pub fn expand(text: String, grids: &[ImageGrid]) -> Result<String, RenderError> {
    let found = text.matches(IMAGE_PAD).count();
    if found != grids.len() {
        return Err(RenderError::Template(format!(
            "the chat template wrote {found} image placeholders ({IMAGE_PAD}) for {} images: \
             it must render each image part once",
            grids.len()
        )));
    }
    if grids.is_empty() {
        return Ok(text);
    }
    let extra: usize = grids.iter().map(|g| g.pad_count.saturating_sub(1)).sum();
    let mut out = String::with_capacity(text.len() + extra * IMAGE_PAD.len());
    let mut rest = text.as_str();
    for g in grids {
        let Some(at) = rest.find(IMAGE_PAD) else {
            break;
        };
        out.push_str(&rest[..at]);
        for _ in 0..g.pad_count {
            out.push_str(IMAGE_PAD);
        }
        rest = &rest[at + IMAGE_PAD.len()..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::vision::VisionFamily;

    #[test]
    fn each_pad_becomes_its_images_run() {
        let vision = VisionConfig::defaults(VisionFamily::Qwen2Vl);
        let messages = vec![
            serde_json::json!({"role": "user", "content": [
                image_part("aa", 56, 56),
                {"type": "text", "text": "and"},
                image_part("bb", 112, 56),
            ]}),
            serde_json::json!({"role": "assistant", "content": "ok"}),
        ];
        let grids = message_grids(&vision, &messages).expect("grids");
        assert_eq!(
            grids.iter().map(|g| g.pad_count).collect::<Vec<_>>(),
            [4, 8]
        );
        let text = format!("a{IMAGE_PAD}b{IMAGE_PAD}c");
        let out = expand(text, &grids).expect("expanded");
        assert_eq!(
            out,
            format!("a{}b{}c", IMAGE_PAD.repeat(4), IMAGE_PAD.repeat(8))
        );
        let err = expand(IMAGE_PAD.to_string(), &grids).expect_err("one pad for two");
        assert!(err.to_string().contains("1 image placeholders"), "{err}");
    }
}
