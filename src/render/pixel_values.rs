//! Qwen-VL `pixel_values`: an image's patches exactly as transformers'
//! PIL-backend image processor computes them (`Qwen2VLImageProcessorPil`,
//! models/qwen2_vl/image_processing_pil_qwen2_vl.py, transformers 5.23),
//! for a trainer that asks the export for them.
//!
//! The steps and their arithmetic: the image as `load_image` gives it
//! ([`load_rgb8`]: JPEG through libjpeg-turbo's decoder as Pillow drives
//! it, other formats through [`super::image::decode_rgb8`]); Pillow's
//! bicubic resize to the
//! [`smart_resize`](super::vision::smart_resize) size
//! ([`super::resample`]); `rescale` (`u8 as f64 * rescale_factor`, then
//! f32: image_transforms.py `rescale`); `normalize` (`(x - mean) / std` in
//! f32, mean and std cast to f32: image_transforms.py `normalize`); then
//! `patchify`: one row per patch, patches in merge-block order, each row
//! `C x temporal_patch_size x patch x patch` with the frame repeated.
//! Nothing here panics on input.

use std::path::Path;

use serde_json::{Map, Value as Json};

use super::image::{ImageError, ImageMime};
use super::resample::{resize_bicubic, Rgb8};
use super::vision::{processor_config, ImageGrid, ResizeError, VisionConfig, VisionConfigError};

/// `OPENAI_CLIP_MEAN` / `OPENAI_CLIP_STD` (transformers image_utils.py),
/// the processor's class defaults.
const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];
/// `PILImageResampling.BICUBIC`, the only resample supported here.
const BICUBIC: u64 = 3;

/// What decides an image's pixel values: the grid's config and the
/// processor's rescale and normalisation.
#[derive(Debug, Clone, PartialEq)]
pub struct PixelConfig {
    pub vision: VisionConfig,
    /// `rescale_factor` when `do_rescale` (default 1/255).
    pub rescale: Option<f64>,
    /// `(image_mean, image_std)` when `do_normalize` (default CLIP's).
    pub normalize: Option<([f64; 3], [f64; 3])>,
}

/// One image's patches: `[patches, dim]` f32, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Patches {
    pub values: Vec<f32>,
    pub grid: ImageGrid,
    /// `3 * temporal_patch_size * patch_size^2`.
    pub dim: usize,
}

/// Why an image has no pixel values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PixelError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Resize(#[from] ResizeError),
    #[error("the image's grid {got:?} is not the recorded {recorded:?}")]
    GridMismatch { got: [u64; 3], recorded: [u64; 3] },
}

impl PixelConfig {
    /// The config of a model directory (the file [`VisionConfig`] reads).
    pub fn from_model_dir(vision: VisionConfig, dir: &Path) -> Result<Self, VisionConfigError> {
        let (path, doc) = processor_config(dir)?;
        Self::from_json(vision, &doc).map_err(|m| super::vision::invalid(&path, &m))
    }

    /// An image processor dict's `do_rescale`, `rescale_factor`,
    /// `do_normalize`, `image_mean`, `image_std` (null or absent: the
    /// class default). A processor that does not resize with BICUBIC or
    /// convert to RGB is refused: its output is not computed here.
    pub fn from_json(vision: VisionConfig, doc: &Map<String, Json>) -> Result<Self, String> {
        let get = |k: &str| doc.get(k).filter(|v| !v.is_null());
        let flag = |k: &str| match get(k) {
            None => Ok(true),
            Some(v) => v
                .as_bool()
                .ok_or(format!("{k} must be true or false, got {v}")),
        };
        for key in ["do_resize", "do_convert_rgb"] {
            if !flag(key)? {
                return Err(format!(
                    "{key} = false: pixel values are computed only with it on"
                ));
            }
        }
        if let Some(r) = get("resample") {
            if r.as_u64() != Some(BICUBIC) {
                return Err(format!(
                    "resample = {r}: pixel values are computed only with BICUBIC (3)"
                ));
            }
        }
        let rescale = match flag("do_rescale")? {
            false => None,
            true => Some(match get("rescale_factor") {
                None => 1.0 / 255.0,
                Some(v) => v
                    .as_f64()
                    .ok_or(format!("rescale_factor must be a number, got {v}"))?,
            }),
        };
        let normalize = match flag("do_normalize")? {
            false => None,
            true => Some((
                triple(get("image_mean"), "image_mean", CLIP_MEAN)?,
                triple(get("image_std"), "image_std", CLIP_STD)?,
            )),
        };
        Ok(Self {
            vision,
            rescale,
            normalize,
        })
    }

    /// Values per patch row: `3 * temporal_patch_size * patch_size^2`.
    pub fn dim(&self) -> usize {
        let p = self.vision.patch_size as usize;
        3 * self.vision.temporal_patch_size as usize * p * p
    }

    /// The pixel values of stored image bytes. `recorded` is the grid the
    /// call recorded; another grid is refused (the values would not match
    /// the prompt's pad run).
    pub fn compute(
        &self,
        bytes: &[u8],
        mime: &str,
        recorded: [u64; 3],
    ) -> Result<Patches, PixelError> {
        let rgb = load_rgb8(bytes, mime)?;
        let grid = self
            .vision
            .image_grid(rgb.height as u64, rgb.width as u64)?;
        if grid.thw() != recorded {
            return Err(PixelError::GridMismatch {
                got: grid.thw(),
                recorded,
            });
        }
        let resized = resize_bicubic(
            &rgb,
            grid.resized_width as usize,
            grid.resized_height as usize,
        );
        let planes = self.planes(&resized);
        Ok(Patches {
            values: patchify(
                &planes,
                resized.height,
                resized.width,
                self.vision.patch_size as usize,
                self.vision.merge_size as usize,
                self.vision.temporal_patch_size as usize,
            ),
            grid,
            dim: self.dim(),
        })
    }

    /// Rescaled and normalised channel planes (`[3, h, w]`, f32).
    fn planes(&self, img: &Rgb8) -> Vec<f32> {
        let n = img.width * img.height;
        let mut out = vec![0f32; 3 * n];
        let norm = self
            .normalize
            .map(|(m, s)| (m.map(|x| x as f32), s.map(|x| x as f32)));
        for (i, px) in img.data.chunks_exact(3).enumerate() {
            for c in 0..3 {
                let v = match self.rescale {
                    Some(f) => (f64::from(px[c]) * f) as f32,
                    None => f32::from(px[c]),
                };
                out[c * n + i] = match norm {
                    Some((mean, std)) => (v - mean[c]) / std[c],
                    None => v,
                };
            }
        }
        out
    }
}

/// An image as transformers' `load_image` gives it (RGB8, EXIF orientation
/// applied). JPEG goes through libjpeg-turbo's decoder (mozjpeg's), the one
/// Pillow links, so the pixels are Pillow's; other formats through
/// [`super::image::decode_rgb8`].
pub fn load_rgb8(bytes: &[u8], mime: &str) -> Result<Rgb8, ImageError> {
    match ImageMime::parse(mime) {
        Some(ImageMime::Jpeg) => jpeg_rgb8(bytes),
        _ => super::image::decode_rgb8(bytes, mime),
    }
}

/// A JPEG decoded as Pillow 13 decodes it (src/libImaging/JpegDecode.c):
/// libjpeg's defaults (JDCT_ISLOW, fancy upsampling, block smoothing), one
/// component read as L and three as RGB (JpegImagePlugin.py `SOF`); then
/// the EXIF orientation and `convert("RGB")` as for other formats. Four
/// components (CMYK, YCCK) are refused: Pillow converts those itself.
fn jpeg_rgb8(bytes: &[u8]) -> Result<Rgb8, ImageError> {
    let fail = |message: String| ImageError::Undecodable {
        mime: ImageMime::Jpeg,
        message,
    };
    // libjpeg reports errors by unwinding out of the decoder (mozjpeg's
    // error manager): caught here, they become an error.
    let decoded = std::panic::catch_unwind(|| -> Result<::image::DynamicImage, String> {
        let io = |e: std::io::Error| e.to_string();
        let mut d = mozjpeg::Decompress::new_mem(bytes).map_err(io)?;
        let components = d.components().len();
        d.dct_method(mozjpeg::DctMethod::IntegerSlow);
        d.do_fancy_upsampling(true);
        let mut started = match components {
            1 => d.grayscale().map_err(io)?,
            3 => d.rgb().map_err(io)?,
            n => {
                return Err(format!(
                    "{n} components: only grey and RGB JPEGs have pixel values"
                ))
            }
        };
        let (w, h) = (started.width() as u32, started.height() as u32);
        let data: Vec<u8> = started.read_scanlines().map_err(io)?;
        started.finish().map_err(io)?;
        let short = || format!("{w}x{h}: the decoder gave fewer lines");
        Ok(if components == 1 {
            ::image::GrayImage::from_raw(w, h, data)
                .ok_or_else(short)?
                .into()
        } else {
            ::image::RgbImage::from_raw(w, h, data)
                .ok_or_else(short)?
                .into()
        })
    });
    let image = match decoded {
        Ok(result) => result.map_err(fail)?,
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "libjpeg error".to_string());
            return Err(fail(message));
        }
    };
    let orientation = super::image::exif_orientation(bytes, ImageMime::Jpeg)?;
    super::image::oriented_rgb8(image, orientation, ImageMime::Jpeg)
}

/// A number for all three channels, or a list of three.
fn triple(v: Option<&Json>, key: &str, default: [f64; 3]) -> Result<[f64; 3], String> {
    let bad = || format!("{key} must be a number or a list of 3 numbers");
    match v {
        None => Ok(default),
        Some(Json::Number(n)) => n.as_f64().map(|x| [x; 3]).ok_or_else(bad),
        Some(Json::Array(xs)) if xs.len() == 3 => {
            let mut out = [0.0; 3];
            for (o, x) in out.iter_mut().zip(xs) {
                *o = x.as_f64().ok_or_else(bad)?;
            }
            Ok(out)
        }
        Some(_) => Err(bad()),
    }
}

/// transformers' `patchify` on `[C, h, w]` planes: the image reshaped to
/// `(C, gh/m, m, p, gw/m, m, p)`, transposed to `(gh/m, gw/m, m, m, C, p,
/// p)`, the frame repeated `t` times after `C`, flattened to
/// `[gh * gw, C * t * p * p]`. `h` and `w` are multiples of `p * m`.
pub fn patchify(planes: &[f32], h: usize, w: usize, p: usize, m: usize, t: usize) -> Vec<f32> {
    let channels = planes.len() / (h * w).max(1);
    let (gh, gw) = (h / p, w / p);
    let mut out = Vec::with_capacity(gh * gw * channels * t * p * p);
    for bh in 0..gh / m {
        for bw in 0..gw / m {
            for mh in 0..m {
                for mw in 0..m {
                    let (y0, x0) = ((bh * m + mh) * p, (bw * m + mw) * p);
                    for c in 0..channels {
                        let plane = &planes[c * h * w..(c + 1) * h * w];
                        for _ in 0..t {
                            for py in 0..p {
                                let at = (y0 + py) * w + x0;
                                out.extend_from_slice(&plane[at..at + p]);
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::vision::VisionFamily;

    /// Each value encodes where it came from: `c * 10000 + y * 100 + x`.
    fn coded(c: usize, h: usize, w: usize) -> Vec<f32> {
        let mut v = Vec::new();
        for ci in 0..c {
            for y in 0..h {
                for x in 0..w {
                    v.push((ci * 10000 + y * 100 + x) as f32);
                }
            }
        }
        v
    }

    #[test]
    fn patch_rows_follow_the_processors_transpose() {
        // 3 channels, 8 x 12 pixels, patch 2, merge 2, temporal 2:
        // grid 4 x 6, 24 rows of 3 * 2 * 2 * 2 = 24 values.
        let out = patchify(&coded(3, 8, 12), 8, 12, 2, 2, 2);
        assert_eq!(out.len(), 24 * 24);
        let row = |r: usize| &out[r * 24..(r + 1) * 24];
        // Row 0: block (0, 0), patch (0, 0): channel 0 frame 0 is pixels
        // (0,0) (0,1) (1,0) (1,1); frame 1 repeats it; then channel 1.
        assert_eq!(&row(0)[..8], &[0., 1., 100., 101., 0., 1., 100., 101.]);
        assert_eq!(&row(0)[8..12], &[10000., 10001., 10100., 10101.]);
        // Row 1: the same merge block, patch column 1 (x 2..4).
        assert_eq!(&row(1)[..4], &[2., 3., 102., 103.]);
        // Row 2: merge row 1 (y 2..4), column 0.
        assert_eq!(&row(2)[..4], &[200., 201., 300., 301.]);
        // Row 4: the next merge block to the right (x 4..6).
        assert_eq!(&row(4)[..4], &[4., 5., 104., 105.]);
        // Row 12: the second row of merge blocks (y 4..6), x 0..2.
        assert_eq!(&row(12)[..4], &[400., 401., 500., 501.]);
        // The last value: channel 2, frame 1, pixel (7, 11).
        assert_eq!(out[out.len() - 1], 20711.);
    }

    /// A `w` x `h` JPEG of `color_space` made by libjpeg, from a gradient.
    fn jpeg(color_space: mozjpeg::ColorSpace, w: usize, h: usize) -> Vec<u8> {
        let mut c = mozjpeg::Compress::new(color_space);
        c.set_size(w, h);
        let n = c.components().len();
        let data: Vec<u8> = (0..w * h * n).map(|i| (i * 7 % 251) as u8).collect();
        let mut started = c.start_compress(Vec::new()).expect("start");
        started.write_scanlines(&data).expect("write");
        started.finish().expect("finish")
    }

    #[test]
    fn jpegs_decode_through_libjpeg_to_rgb() {
        let rgb =
            load_rgb8(&jpeg(mozjpeg::ColorSpace::JCS_RGB, 37, 21), "image/jpeg").expect("rgb jpeg");
        assert_eq!(
            (rgb.width, rgb.height, rgb.data.len()),
            (37, 21, 37 * 21 * 3)
        );
        // Grey is repeated into the three channels, as convert("RGB") does.
        let grey = load_rgb8(&jpeg(mozjpeg::ColorSpace::JCS_GRAYSCALE, 9, 5), "image/jpg")
            .expect("grey jpeg");
        assert_eq!((grey.width, grey.height), (9, 5));
        assert!(grey
            .data
            .chunks_exact(3)
            .all(|p| p[0] == p[1] && p[1] == p[2]));
    }

    #[test]
    fn cmyk_and_broken_jpegs_are_errors_not_panics() {
        let cmyk = load_rgb8(&jpeg(mozjpeg::ColorSpace::JCS_CMYK, 8, 8), "image/jpeg");
        assert!(
            matches!(&cmyk, Err(ImageError::Undecodable { message, .. }) if message.contains("4 components")),
            "{cmyk:?}"
        );
        let mut cut = jpeg(mozjpeg::ColorSpace::JCS_RGB, 16, 16);
        cut.truncate(30);
        for bad in [&b"\xff\xd8not a jpeg"[..], &cut, &[]] {
            assert!(load_rgb8(bad, "image/jpeg").is_err());
        }
    }

    #[test]
    fn a_flat_image_normalises_per_channel() {
        let vision = VisionConfig {
            patch_size: 2,
            merge_size: 2,
            temporal_patch_size: 2,
            min_pixels: 16,
            max_pixels: 64,
            family: VisionFamily::Qwen2Vl,
        };
        let doc: Map<String, Json> = serde_json::from_str(
            r#"{"image_mean": [0.5, 0.25, 0.0], "image_std": 0.5, "rescale_factor": 0.00392156862745098}"#,
        )
        .expect("json");
        let cfg = PixelConfig::from_json(vision, &doc).expect("config");
        let img = Rgb8 {
            width: 4,
            height: 4,
            data: [255u8, 0, 51].repeat(16),
        };
        let planes = cfg.planes(&img);
        let want = |v: u8, m: f32| ((f64::from(v) * (1.0 / 255.0)) as f32 - m) / 0.5f32;
        assert_eq!(planes[0], want(255, 0.5));
        assert_eq!(planes[16], want(0, 0.25));
        assert_eq!(planes[32], want(51, 0.0));
        assert_eq!(cfg.dim(), 24);
        // Defaults: CLIP's mean and std, 1/255.
        let d = PixelConfig::from_json(vision, &Map::new()).expect("defaults");
        assert_eq!(d.rescale, Some(1.0 / 255.0));
        assert_eq!(d.normalize, Some((CLIP_MEAN, CLIP_STD)));
        let bad: Map<String, Json> = serde_json::from_str(r#"{"resample": 2}"#).expect("json");
        assert!(PixelConfig::from_json(vision, &bad).is_err());
    }
}
