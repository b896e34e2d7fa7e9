//! Qwen-VL image placeholders: how many `<|image_pad|>` tokens an image of a
//! given size renders as, exactly as transformers' image processor counts.
//!
//! Qwen2-VL, Qwen2.5-VL and Qwen3-VL all use transformers'
//! `Qwen2VLImageProcessor` (models/qwen2_vl/image_processing_qwen2_vl.py,
//! transformers 5.23.0); the families differ only in the values their
//! `preprocessor_config.json` ships. An image of height x width is resized by
//! [`smart_resize`] to multiples of `patch_size * merge_size`, cut into a
//! `(1, h / patch_size, w / patch_size)` grid of patches, and each
//! `merge_size x merge_size` block of patches is one pad token.
//! Goldens: tests/fixtures/goldens/vision.json (scripts/gen_goldens_vision.py).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value as Json};

use crate::error::ApiError;

pub const VISION_START: &str = "<|vision_start|>";
pub const IMAGE_PAD: &str = "<|image_pad|>";
pub const VISION_END: &str = "<|vision_end|>";

/// The model family, which names its template tokens and shipped config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VisionFamily {
    /// Qwen2-VL and Qwen2.5-VL.
    Qwen2Vl,
    Qwen3Vl,
}

impl VisionFamily {
    /// `"qwen2_vl"` or `"qwen3_vl"` (the `[model] vision` values).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "qwen2_vl" => Some(Self::Qwen2Vl),
            "qwen3_vl" => Some(Self::Qwen3Vl),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Qwen2Vl => "qwen2_vl",
            Self::Qwen3Vl => "qwen3_vl",
        }
    }
}

/// The image processor's values that decide the placeholder count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VisionConfig {
    pub family: VisionFamily,
    pub patch_size: u32,
    pub merge_size: u32,
    pub temporal_patch_size: u32,
    /// `size.shortest_edge`: the least resized area.
    pub min_pixels: u64,
    /// `size.longest_edge`: the most resized area.
    pub max_pixels: u64,
}

/// An image's resized size, patch grid and pad count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageGrid {
    pub resized_height: u64,
    pub resized_width: u64,
    /// 1 for an image: its `temporal_patch_size` frames are the same image.
    pub grid_t: u64,
    pub grid_h: u64,
    pub grid_w: u64,
    /// `grid_t * grid_h * grid_w / merge_size^2` `<|image_pad|>` tokens.
    pub pad_count: usize,
}

impl ImageGrid {
    /// The processor's `image_grid_thw` row.
    pub fn thw(&self) -> [u64; 3] {
        [self.grid_t, self.grid_h, self.grid_w]
    }
}

/// Why an image size has no resize. Each is the caller's image (a 400).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResizeError {
    #[error("image is {width}x{height}: a side of zero pixels")]
    ZeroSize { height: u64, width: u64 },
    #[error(
        "image is {width}x{height}: aspect ratio {ratio} is over 200, \
         the most the vision processor takes"
    )]
    AspectRatio { height: u64, width: u64, ratio: f64 },
    #[error("image is {width}x{height}: too large for the vision processor's resize")]
    TooLarge { height: u64, width: u64 },
}

impl From<ResizeError> for ApiError {
    fn from(e: ResizeError) -> Self {
        ApiError::bad_request(e.to_string())
    }
}

/// A model directory's image processor config that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VisionConfigError {
    #[error(
        "{dir}: no image processor config (preprocessor_config.json, or processor_config.json \
         with an image_processor key)"
    )]
    Missing { dir: String },
    #[error("cannot read {path}: {message}")]
    Read { path: String, message: String },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

/// Largest integer f64 holds exactly: past it Python's int arithmetic and
/// ours would part.
const EXACT: u64 = 1 << 53;

/// transformers' `smart_resize(height, width, factor, min_pixels,
/// max_pixels)`: (height, width) rounded to multiples of `factor`, the area
/// then scaled into [min_pixels, max_pixels] if outside. Python's `round`
/// (ties to even), `math.floor`, `math.ceil` and `math.sqrt`, on the same
/// f64 values in the same order.
pub fn smart_resize(
    height: u64,
    width: u64,
    factor: u64,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(u64, u64), ResizeError> {
    let (h, w) = (height, width);
    if h.min(w) == 0 {
        // Python: ZeroDivisionError in the aspect-ratio check.
        return Err(ResizeError::ZeroSize { height, width });
    }
    let too_large = ResizeError::TooLarge { height, width };
    let area = h
        .checked_mul(w)
        .filter(|&a| a <= EXACT)
        .ok_or(too_large.clone())?;
    if factor == 0 || factor > EXACT || min_pixels > EXACT || max_pixels > EXACT {
        return Err(too_large);
    }
    let ratio = h.max(w) as f64 / h.min(w) as f64;
    if ratio > 200.0 {
        return Err(ResizeError::AspectRatio {
            height,
            width,
            ratio,
        });
    }
    let (hf, wf, ff) = (h as f64, w as f64, factor as f64);
    let times = |x: f64| -> Result<u64, ResizeError> {
        (x as u64).checked_mul(factor).ok_or(too_large.clone())
    };
    let mut h_bar = times((hf / ff).round_ties_even())?;
    let mut w_bar = times((wf / ff).round_ties_even())?;
    let bar_area = h_bar.checked_mul(w_bar).ok_or(too_large.clone())?;
    if bar_area > max_pixels {
        let beta = (area as f64 / max_pixels as f64).sqrt();
        h_bar = factor.max(times((hf / beta / ff).floor())?);
        w_bar = factor.max(times((wf / beta / ff).floor())?);
    } else if bar_area < min_pixels {
        let beta = (min_pixels as f64 / area as f64).sqrt();
        h_bar = times((hf * beta / ff).ceil())?;
        w_bar = times((wf * beta / ff).ceil())?;
    }
    Ok((h_bar, w_bar))
}

/// `<|vision_start|>` + `<|image_pad|>` x `pad_count` + `<|vision_end|>`.
pub fn image_placeholder(pad_count: usize) -> String {
    let mut s =
        String::with_capacity(VISION_START.len() + IMAGE_PAD.len() * pad_count + VISION_END.len());
    s.push_str(VISION_START);
    for _ in 0..pad_count {
        s.push_str(IMAGE_PAD);
    }
    s.push_str(VISION_END);
    s
}

impl VisionConfig {
    /// `Qwen2VLImageProcessor`'s class defaults, what transformers uses for
    /// a key the config leaves out. The same for both families: Qwen3-VL has
    /// no image processor class of its own (its checkpoints ship patch_size
    /// 16 and a size of [65536, 16777216] in preprocessor_config.json).
    pub fn defaults(family: VisionFamily) -> Self {
        Self {
            family,
            patch_size: 14,
            merge_size: 2,
            temporal_patch_size: 2,
            min_pixels: 56 * 56,
            max_pixels: 28 * 28 * 1280,
        }
    }

    /// `patch_size * merge_size`: resized sides are multiples of it.
    pub fn factor(&self) -> u64 {
        u64::from(self.patch_size) * u64::from(self.merge_size)
    }

    /// The image processor config of a model directory, found as
    /// transformers finds it: `processor_config.json`'s `image_processor`
    /// object if there is one, else `preprocessor_config.json`.
    pub fn from_model_dir(family: VisionFamily, dir: &Path) -> Result<Self, VisionConfigError> {
        let (path, doc) = processor_config(dir)?;
        Self::from_json(family, &doc).map_err(|message| invalid(&path, &message))
    }

    /// An image processor dict, read as `Qwen2VLImageProcessor.__init__`
    /// reads it: `size` (if given) replaces the default
    /// `{shortest_edge, longest_edge}` whole, then top-level `min_pixels` /
    /// `max_pixels` (if not null) override its two edges. Both edges must end
    /// up positive (transformers refuses the first image otherwise).
    pub fn from_json(family: VisionFamily, doc: &Map<String, Json>) -> Result<Self, String> {
        let d = Self::defaults(family);
        let (mut min_pixels, mut max_pixels) = match doc.get("size") {
            None | Some(Json::Null) => (Some(d.min_pixels), Some(d.max_pixels)),
            Some(Json::Object(size)) => (
                pixels(size, "shortest_edge", "size.shortest_edge")?,
                pixels(size, "longest_edge", "size.longest_edge")?,
            ),
            Some(other) => return Err(format!("size must be an object, got {other}")),
        };
        if let Some(v) = pixels(doc, "min_pixels", "min_pixels")? {
            min_pixels = Some(v);
        }
        if let Some(v) = pixels(doc, "max_pixels", "max_pixels")? {
            max_pixels = Some(v);
        }
        let edge = |v: Option<u64>, name: &str| {
            v.filter(|&v| v > 0).ok_or(format!(
                "the image size needs a positive {name} (size.{name}, or {})",
                if name == "shortest_edge" {
                    "min_pixels"
                } else {
                    "max_pixels"
                }
            ))
        };
        Ok(Self {
            family,
            patch_size: positive(doc, "patch_size", d.patch_size)?,
            merge_size: positive(doc, "merge_size", d.merge_size)?,
            temporal_patch_size: positive(doc, "temporal_patch_size", d.temporal_patch_size)?,
            min_pixels: edge(min_pixels, "shortest_edge")?,
            max_pixels: edge(max_pixels, "longest_edge")?,
        })
    }

    /// [`smart_resize`] with this config's factor and bounds.
    pub fn resize(&self, height: u64, width: u64) -> Result<(u64, u64), ResizeError> {
        smart_resize(
            height,
            width,
            self.factor(),
            self.min_pixels,
            self.max_pixels,
        )
    }

    /// The resized size, `image_grid_thw` and pad count of an image.
    pub fn image_grid(&self, height: u64, width: u64) -> Result<ImageGrid, ResizeError> {
        let (resized_height, resized_width) = self.resize(height, width)?;
        let patch = u64::from(self.patch_size);
        let merge = u64::from(self.merge_size);
        let (grid_t, grid_h, grid_w) = (1, resized_height / patch, resized_width / patch);
        let pad_count = usize::try_from(grid_t * grid_h * grid_w / (merge * merge))
            .map_err(|_| ResizeError::TooLarge { height, width })?;
        Ok(ImageGrid {
            resized_height,
            resized_width,
            grid_t,
            grid_h,
            grid_w,
            pad_count,
        })
    }

    /// The prompt text an image renders as.
    pub fn placeholder(&self, height: u64, width: u64) -> Result<String, ResizeError> {
        Ok(image_placeholder(self.image_grid(height, width)?.pad_count))
    }
}

/// A model directory's image processor dict and the file it came from:
/// `processor_config.json`'s `image_processor` object if there is one, else
/// `preprocessor_config.json` (transformers' order).
pub fn processor_config(dir: &Path) -> Result<(PathBuf, Map<String, Json>), VisionConfigError> {
    let nested = dir.join("processor_config.json");
    if nested.is_file() {
        let mut doc = read_json_object(&nested)?;
        if let Some(inner) = doc.remove("image_processor") {
            let Json::Object(inner) = inner else {
                return Err(invalid(&nested, "image_processor is not an object"));
            };
            return Ok((nested, inner));
        }
    }
    let flat = dir.join("preprocessor_config.json");
    if flat.is_file() {
        let doc = read_json_object(&flat)?;
        return Ok((flat, doc));
    }
    Err(VisionConfigError::Missing {
        dir: dir.display().to_string(),
    })
}

fn read_json_object(path: &Path) -> Result<Map<String, Json>, VisionConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| VisionConfigError::Read {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    match serde_json::from_str(&text) {
        Ok(Json::Object(doc)) => Ok(doc),
        Ok(_) => Err(invalid(path, "not a JSON object")),
        Err(e) => Err(invalid(path, &format!("not JSON: {e}"))),
    }
}

pub(crate) fn invalid(path: &Path, message: &str) -> VisionConfigError {
    VisionConfigError::Invalid {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

/// An optional area key (null: absent); an integer up to 2^53.
fn pixels(doc: &Map<String, Json>, key: &str, shown: &str) -> Result<Option<u64>, String> {
    match doc.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n <= EXACT => Ok(Some(n)),
            _ => Err(format!(
                "{shown} must be an integer from 0 to 2^53, got {v}"
            )),
        },
    }
}

/// A patch key: absent is the default; present, a positive u32.
fn positive(doc: &Map<String, Json>, key: &str, default: u32) -> Result<u32, String> {
    match doc.get(key) {
        None => Ok(default),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| n > 0)
            .ok_or(format!("{key} must be a positive integer, got {v}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen2() -> VisionConfig {
        VisionConfig {
            max_pixels: 12_845_056,
            ..VisionConfig::defaults(VisionFamily::Qwen2Vl)
        }
    }

    // Hand cross-checks of the rule (factor 28, min 3136, max 12845056).
    #[test]
    fn smart_resize_by_hand() {
        // 1x1: round(1/28) = 0, area 0 < 3136; beta = sqrt(3136/1) = 56,
        // ceil(1*56/28) = 2 -> 56x56.
        assert_eq!(qwen2().resize(1, 1), Ok((56, 56)));
        // 70/28 = 2.5 rounds to 2 (ties to even), 700/28 = 25: 56x700, in range.
        assert_eq!(qwen2().resize(70, 700), Ok((56, 700)));
        // 98/28 = 3.5 rounds to 4: 112x700.
        assert_eq!(qwen2().resize(98, 700), Ok((112, 700)));
        // 14/28 = 0.5 rounds to 0, so the ceil branch: beta = sqrt(3136/9800)
        // = 0.5657; ceil(14*0.5657/28) = 1, ceil(700*0.5657/28) = 15 -> 28x420.
        assert_eq!(qwen2().resize(14, 700), Ok((28, 420)));
        // 10000x8000: beta = sqrt(8e7/12845056) = 2.4956; floor(10000/2.4956/28)
        // = 143, floor(8000/2.4956/28) = 114 -> 4004x3192.
        assert_eq!(qwen2().resize(10000, 8000), Ok((4004, 3192)));
    }

    #[test]
    fn grid_and_pad_count() {
        let g = qwen2().image_grid(768, 1024).expect("grid");
        assert_eq!((g.resized_height, g.resized_width), (756, 1036));
        assert_eq!(g.thw(), [1, 54, 74]);
        assert_eq!(g.pad_count, 54 * 74 / 4);
        let text = qwen2().placeholder(1, 1).expect("placeholder");
        assert_eq!(
            text,
            format!("{VISION_START}{}{VISION_END}", IMAGE_PAD.repeat(4))
        );
        assert_eq!(image_placeholder(0), format!("{VISION_START}{VISION_END}"));
    }

    #[test]
    fn refused_sizes() {
        assert!(matches!(
            qwen2().resize(1, 201),
            Err(ResizeError::AspectRatio { .. })
        ));
        assert_eq!(qwen2().resize(10, 2000), Ok((28, 812)));
        assert_eq!(
            qwen2().resize(0, 5),
            Err(ResizeError::ZeroSize {
                height: 0,
                width: 5
            })
        );
        assert!(matches!(
            qwen2().resize(u64::MAX, u64::MAX),
            Err(ResizeError::TooLarge { .. })
        ));
        let msg = qwen2().resize(1, 300).expect_err("ratio").to_string();
        assert!(msg.contains("300x1") && msg.contains("200"), "{msg}");
    }

    #[test]
    fn config_keys() {
        let json = |s: &str| -> Map<String, Json> { serde_json::from_str(s).expect("json") };
        let fam = VisionFamily::Qwen3Vl;
        let c = VisionConfig::from_json(
            fam,
            &json(
                r#"{"size": {"shortest_edge": 65536, "longest_edge": 16777216}, "patch_size": 16}"#,
            ),
        )
        .expect("qwen3");
        assert_eq!(
            (c.patch_size, c.min_pixels, c.max_pixels),
            (16, 65536, 16_777_216)
        );
        let c =
            VisionConfig::from_json(fam, &json(r#"{"max_pixels": 100000, "min_pixels": null}"#))
                .expect("partial");
        assert_eq!((c.min_pixels, c.max_pixels), (3136, 100_000));
        for bad in [
            r#"{"size": {"longest_edge": 5}}"#,
            r#"{"max_pixels": 0}"#,
            r#"{"patch_size": 0}"#,
            r#"{"patch_size": "14"}"#,
            r#"{"min_pixels": 1.5}"#,
            r#"{"size": 3}"#,
        ] {
            assert!(VisionConfig::from_json(fam, &json(bad)).is_err(), "{bad}");
        }
        assert_eq!(VisionFamily::parse("qwen3_vl"), Some(fam));
        assert_eq!(VisionFamily::parse(fam.as_str()), Some(fam));
        assert_eq!(VisionFamily::parse("none"), None);
    }
}
