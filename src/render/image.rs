//! Image inputs: an OpenAI `image_url` value (a `data:` URL) or raw bytes
//! with a declared MIME type, checked into [`ImageData`]: the original bytes,
//! their real format, size and SHA-256.
//!
//! Only PNG, JPEG, WebP and GIF (its first frame) are taken. Every refusal is
//! an [`ImageError`] whose message names the cause, fit for a 400. `http(s)://`
//! URLs are refused here ([`ImageError::FetchDisabled`]): fetching is the
//! request path's, behind an allow-list. Nothing here panics on input.

use std::io::Cursor;

use ::image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits};
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// The image formats tito takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageMime {
    Png,
    Jpeg,
    Webp,
    Gif,
}

impl ImageMime {
    /// A declared MIME type (case-insensitive; `image/jpg` is taken as JPEG).
    pub fn parse(mime: &str) -> Option<Self> {
        match mime.trim().to_ascii_lowercase().as_str() {
            "image/png" => Some(Self::Png),
            "image/jpeg" | "image/jpg" => Some(Self::Jpeg),
            "image/webp" => Some(Self::Webp),
            "image/gif" => Some(Self::Gif),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Png => "image/png",
            Self::Jpeg => "image/jpeg",
            Self::Webp => "image/webp",
            Self::Gif => "image/gif",
        }
    }

    fn format(self) -> ImageFormat {
        match self {
            Self::Png => ImageFormat::Png,
            Self::Jpeg => ImageFormat::Jpeg,
            Self::Webp => ImageFormat::WebP,
            Self::Gif => ImageFormat::Gif,
        }
    }

    fn from_format(format: ImageFormat) -> Option<Self> {
        match format {
            ImageFormat::Png => Some(Self::Png),
            ImageFormat::Jpeg => Some(Self::Jpeg),
            ImageFormat::WebP => Some(Self::Webp),
            ImageFormat::Gif => Some(Self::Gif),
            _ => None,
        }
    }
}

impl std::fmt::Display for ImageMime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Per-image bounds, checked before the pixels are decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Most width x height (`[model] max_image_pixels`).
    pub max_pixels: u64,
    /// Most bytes of the encoded image (`[model] max_image_bytes`).
    pub max_bytes: usize,
}

impl Default for ImageLimits {
    /// 32 Mi pixels (8192x4096) and 20 MiB: defaults for the wiring.
    fn default() -> Self {
        Self {
            max_pixels: 32 * 1024 * 1024,
            max_bytes: 20 * 1024 * 1024,
        }
    }
}

/// A checked image: its bytes as sent, and what they decode to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageData {
    /// The original encoded bytes (what is stored and exported).
    pub bytes: Vec<u8>,
    /// The real format, which the declared MIME type matched.
    pub mime: ImageMime,
    /// Stored width and height (GIF: the logical screen), before any EXIF
    /// rotation.
    pub width: u32,
    pub height: u32,
    /// EXIF orientation, 1 to 8 (1: none; 5 to 8 swap width and height when
    /// applied). Not applied here.
    pub exif_orientation: u8,
    /// Lowercase hex SHA-256 of `bytes`.
    pub sha256: String,
}

/// An image of a prompt: its encoded bytes and facts, and the grid of the
/// placeholder run that stands for it in the prompt ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptImage {
    pub sha256: String,
    pub mime: String,
    pub width: u32,
    pub height: u32,
    pub bytes: std::sync::Arc<Vec<u8>>,
    pub grid: super::vision::ImageGrid,
    /// Its `data:` URL, made on first use and shared by the image's clones:
    /// an image the agent resends every turn is encoded for SGLang once.
    pub encoded: std::sync::Arc<std::sync::OnceLock<String>>,
}

impl ImageData {
    /// `(width, height)` as the image shows once its EXIF orientation is
    /// applied (5 to 8 turn it a quarter): what transformers' `load_image`
    /// (image_utils.py, `exif_transpose`) and SGLang (`smart_to_rgb`) give
    /// the vision processor.
    pub fn oriented_size(&self) -> (u32, u32) {
        match self.exif_orientation {
            5..=8 => (self.height, self.width),
            _ => (self.width, self.height),
        }
    }
}

impl PromptImage {
    /// A checked image with its grid; its size is the oriented one.
    pub fn new(data: ImageData, grid: super::vision::ImageGrid) -> Self {
        let (width, height) = data.oriented_size();
        Self {
            sha256: data.sha256,
            mime: data.mime.as_str().to_string(),
            width,
            height,
            bytes: std::sync::Arc::new(data.bytes),
            grid,
            encoded: Default::default(),
        }
    }

    /// The bytes as a base64 `data:` URL (what SGLang's `image_data` takes).
    pub fn data_url(&self) -> &str {
        self.encoded.get_or_init(|| {
            format!(
                "data:{};base64,{}",
                self.mime,
                base64::engine::general_purpose::STANDARD.encode(self.bytes.as_slice())
            )
        })
    }
}

/// Why an image is refused. Every message names the cause (a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error(
        "image_url fetching is off: this gateway takes images only as base64 data: URLs \
         (data:image/png;base64,...), not {scheme}:// URLs"
    )]
    FetchDisabled { scheme: String },
    #[error("image_url must be a data: URL (data:image/png;base64,...); got {got}")]
    UnsupportedUrl { got: String },
    #[error("image data URL is malformed: {0}")]
    MalformedDataUrl(&'static str),
    #[error("image data URL must be base64-encoded (data:{mime};base64,...)")]
    NotBase64 { mime: String },
    #[error("image data is not valid base64: {0}")]
    Base64(String),
    #[error(
        "image MIME type {mime} is not supported: use image/png, image/jpeg, image/webp or image/gif"
    )]
    UnsupportedMime { mime: String },
    #[error("image is empty (no bytes)")]
    Empty,
    #[error("image is {bytes} bytes, over the limit max_image_bytes = {limit}")]
    TooManyBytes { bytes: usize, limit: usize },
    #[error(
        "image is {width}x{height} = {pixels} pixels, over the limit max_image_pixels = {limit}"
    )]
    TooManyPixels {
        width: u32,
        height: u32,
        pixels: u64,
        limit: u64,
    },
    #[error("image is declared {declared} but its bytes are {actual}")]
    WrongMime {
        declared: ImageMime,
        actual: &'static str,
    },
    #[error("image is not a PNG, JPEG, WebP or GIF image (declared {declared})")]
    UnknownFormat { declared: ImageMime },
    #[error("image cannot be decoded as {mime}: {message}")]
    Undecodable { mime: ImageMime, message: String },
}

impl From<ImageError> for ApiError {
    fn from(e: ImageError) -> Self {
        ApiError::bad_request(e.to_string())
    }
}

/// Longest piece of caller input echoed in an error message.
const ECHO_MAX: usize = 40;

fn echo(s: &str) -> String {
    match s.char_indices().nth(ECHO_MAX) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_string(),
    }
}

/// An OpenAI `image_url.url` value: a base64 `data:` URL, checked and decoded.
pub fn parse_image_url(url: &str, limits: &ImageLimits) -> Result<ImageData, ImageError> {
    let url = url.trim_start();
    let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
    if scheme.eq_ignore_ascii_case("data") {
        let (mime, payload) = split_data_url(&url[scheme.len() + 1..])?;
        return decode_base64_image(payload, mime, limits);
    }
    if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") {
        return Err(ImageError::FetchDisabled {
            scheme: scheme.to_ascii_lowercase(),
        });
    }
    Err(ImageError::UnsupportedUrl {
        got: if url.is_empty() {
            "an empty string".to_string()
        } else {
            format!("{:?}", echo(url))
        },
    })
}

/// `MIME[;param]*;base64,PAYLOAD` (after `data:`) into the MIME and payload.
fn split_data_url(rest: &str) -> Result<(&str, &str), ImageError> {
    let (header, payload) = rest
        .split_once(',')
        .ok_or(ImageError::MalformedDataUrl("no ',' before the data"))?;
    let mut parts = header.split(';');
    let mime = parts.next().unwrap_or("").trim();
    if !parts.any(|p| p.trim().eq_ignore_ascii_case("base64")) {
        return Err(ImageError::NotBase64 {
            mime: if mime.is_empty() {
                "image/png".to_string()
            } else {
                echo(mime)
            },
        });
    }
    Ok((mime, payload))
}

/// Standard alphabet; padding optional, as clients differ.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Base64 image data with its declared MIME type (a data URL's parts, or a
/// Messages `{"type": "base64", "media_type", "data"}` source).
pub fn decode_base64_image(
    data: &str,
    declared_mime: &str,
    limits: &ImageLimits,
) -> Result<ImageData, ImageError> {
    let declared = parse_mime(declared_mime)?;
    // Line-wrapped base64 (MIME style) carries whitespace; drop it.
    let compact: std::borrow::Cow<'_, str> = if data.bytes().any(|b| b.is_ascii_whitespace()) {
        data.chars().filter(|c| !c.is_ascii_whitespace()).collect()
    } else {
        data.into()
    };
    // The decoded size, known before decoding: refuse a huge payload unread.
    let digits = compact.trim_end_matches('=').len();
    let size = digits / 4 * 3 + (digits % 4) * 3 / 4;
    if size > limits.max_bytes {
        return Err(ImageError::TooManyBytes {
            bytes: size,
            limit: limits.max_bytes,
        });
    }
    let bytes = BASE64
        .decode(compact.as_bytes())
        .map_err(|e| ImageError::Base64(e.to_string()))?;
    decode_image_checked(bytes, declared, limits)
}

/// Raw image bytes with their declared MIME type (a fetched body and its
/// Content-Type, later).
pub fn decode_image(
    bytes: Vec<u8>,
    declared_mime: &str,
    limits: &ImageLimits,
) -> Result<ImageData, ImageError> {
    let declared = parse_mime(declared_mime)?;
    decode_image_checked(bytes, declared, limits)
}

fn parse_mime(mime: &str) -> Result<ImageMime, ImageError> {
    ImageMime::parse(mime).ok_or_else(|| ImageError::UnsupportedMime {
        mime: if mime.trim().is_empty() {
            "(none)".to_string()
        } else {
            echo(mime.trim())
        },
    })
}

fn decode_image_checked(
    bytes: Vec<u8>,
    declared: ImageMime,
    limits: &ImageLimits,
) -> Result<ImageData, ImageError> {
    if bytes.is_empty() {
        return Err(ImageError::Empty);
    }
    if bytes.len() > limits.max_bytes {
        return Err(ImageError::TooManyBytes {
            bytes: bytes.len(),
            limit: limits.max_bytes,
        });
    }
    // The real format from the magic bytes, whatever the client declared.
    let format =
        ::image::guess_format(&bytes).map_err(|_| ImageError::UnknownFormat { declared })?;
    let mime = match ImageMime::from_format(format) {
        Some(m) if m == declared => m,
        _ => {
            return Err(ImageError::WrongMime {
                declared,
                actual: format.to_mime_type(),
            })
        }
    };
    let undecodable = |e: ::image::ImageError| ImageError::Undecodable {
        mime,
        message: e.to_string(),
    };
    let mut reader = ImageReader::with_format(Cursor::new(bytes.as_slice()), mime.format());
    reader.limits(Limits::default());
    let mut decoder = reader.into_decoder().map_err(undecodable)?;
    // Bound the pixels from the header, before any are decoded.
    let (width, height) = decoder.dimensions();
    let pixels = u64::from(width) * u64::from(height);
    if pixels > limits.max_pixels {
        return Err(ImageError::TooManyPixels {
            width,
            height,
            pixels,
            limit: limits.max_pixels,
        });
    }
    if pixels == 0 {
        return Err(ImageError::Undecodable {
            mime,
            message: format!("it is {width}x{height}"),
        });
    }
    // A bad EXIF block is no reason to refuse the pixels: read it as none.
    let exif_orientation = decoder.orientation().map(|o| o.to_exif()).unwrap_or(1);
    // Decode every pixel (GIF: the first frame) so corrupt data is refused.
    DynamicImage::from_decoder(decoder).map_err(undecodable)?;
    let sha256 = hex::encode(Sha256::digest(&bytes));
    Ok(ImageData {
        bytes,
        mime,
        width,
        height,
        exif_orientation,
        sha256,
    })
}

/// Stored image bytes decoded to 8-bit RGB as transformers' `load_image`
/// gives them: EXIF orientation applied (`exif_transpose`), then Pillow's
/// `convert("RGB")` (alpha dropped, grey repeated, palette looked up).
/// Images of 16 bits a channel are refused: Pillow reads those into other
/// modes than RGB8, so their bytes would not match.
pub fn decode_rgb8(bytes: &[u8], mime: &str) -> Result<super::resample::Rgb8, ImageError> {
    let mime = parse_mime(mime)?;
    let mut decoder = pixel_decoder(bytes, mime)?;
    let orientation = decoder
        .orientation()
        .unwrap_or(::image::metadata::Orientation::NoTransforms);
    let image = DynamicImage::from_decoder(decoder).map_err(|e| undecodable(mime, e))?;
    oriented_rgb8(image, orientation, mime)
}

/// The EXIF orientation [`decode_rgb8`] applies, read from the headers.
pub fn exif_orientation(
    bytes: &[u8],
    mime: ImageMime,
) -> Result<::image::metadata::Orientation, ImageError> {
    let mut decoder = pixel_decoder(bytes, mime)?;
    Ok(decoder
        .orientation()
        .unwrap_or(::image::metadata::Orientation::NoTransforms))
}

/// `image` turned by `orientation`, then converted to RGB8 as
/// [`decode_rgb8`] does (8-bit images only).
pub fn oriented_rgb8(
    mut image: DynamicImage,
    orientation: ::image::metadata::Orientation,
    mime: ImageMime,
) -> Result<super::resample::Rgb8, ImageError> {
    image.apply_orientation(orientation);
    let rgb = match image {
        DynamicImage::ImageLuma8(_)
        | DynamicImage::ImageLumaA8(_)
        | DynamicImage::ImageRgb8(_)
        | DynamicImage::ImageRgba8(_) => image.to_rgb8(),
        other => {
            return Err(ImageError::Undecodable {
                mime,
                message: format!(
                    "{:?} pixels: only 8-bit images have pixel values",
                    other.color()
                ),
            })
        }
    };
    Ok(super::resample::Rgb8 {
        width: rgb.width() as usize,
        height: rgb.height() as usize,
        data: rgb.into_raw(),
    })
}

fn pixel_decoder(bytes: &[u8], mime: ImageMime) -> Result<impl ImageDecoder + '_, ImageError> {
    let mut reader = ImageReader::with_format(Cursor::new(bytes), mime.format());
    reader.limits(Limits::default());
    reader.into_decoder().map_err(|e| undecodable(mime, e))
}

fn undecodable(mime: ImageMime, e: ::image::ImageError) -> ImageError {
    ImageError::Undecodable {
        mime,
        message: e.to_string(),
    }
}
