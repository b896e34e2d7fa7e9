//! Vision inputs: Qwen-VL placeholder counts against transformers' own image
//! processor (tests/fixtures/goldens/vision.json, written by
//! scripts/gen_goldens_vision.py), and image decoding with its refusals, on
//! tiny images encoded here.

use std::io::Cursor;
use std::path::PathBuf;

use base64::Engine as _;
use image::{DynamicImage, ImageEncoder, ImageFormat, Rgb, RgbImage, Rgba, RgbaImage};
use serde::Deserialize;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use tito::render::image::{
    decode_base64_image, decode_image, parse_image_url, ImageError, ImageLimits, ImageMime,
};
use tito::render::vision::{
    image_placeholder, ResizeError, VisionConfig, VisionFamily, IMAGE_PAD, VISION_END, VISION_START,
};

#[derive(Deserialize)]
struct Goldens {
    transformers: String,
    configs: Vec<ConfigCase>,
    resize: Vec<ResizeCase>,
}

#[derive(Deserialize)]
struct ConfigCase {
    name: String,
    family: String,
    files: serde_json::Map<String, Json>,
    expect: Option<Expect>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct Expect {
    patch_size: u32,
    merge_size: u32,
    temporal_patch_size: u32,
    min_pixels: u64,
    max_pixels: u64,
}

#[derive(Deserialize)]
struct ResizeCase {
    config: String,
    height: u64,
    width: u64,
    resized: Option<[u64; 2]>,
    grid_thw: Option<[u64; 3]>,
    pad_count: Option<usize>,
    error: Option<String>,
}

fn goldens() -> Goldens {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/goldens/vision.json");
    let text =
        std::fs::read_to_string(&path).expect("vision.json: run scripts/gen_goldens_vision.py");
    serde_json::from_str(&text).expect("vision.json parses")
}

fn family(name: &str) -> VisionFamily {
    VisionFamily::parse(name).expect("a known family")
}

/// Each config case's files in a model directory, loaded as the gateway will.
fn load_config(case: &ConfigCase) -> Result<VisionConfig, String> {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, body) in &case.files {
        std::fs::write(dir.path().join(name), body.to_string()).expect("write");
    }
    VisionConfig::from_model_dir(family(&case.family), dir.path()).map_err(|e| e.to_string())
}

#[test]
fn configs_load_as_transformers_loads_them() {
    let g = goldens();
    assert!(g.transformers.starts_with('5'), "{}", g.transformers);
    for case in &g.configs {
        match (&case.expect, &case.error) {
            (Some(want), None) => {
                let got = load_config(case).unwrap_or_else(|e| panic!("{}: {e}", case.name));
                assert_eq!(
                    (
                        got.patch_size,
                        got.merge_size,
                        got.temporal_patch_size,
                        got.min_pixels,
                        got.max_pixels
                    ),
                    (
                        want.patch_size,
                        want.merge_size,
                        want.temporal_patch_size,
                        want.min_pixels,
                        want.max_pixels
                    ),
                    "{}",
                    case.name
                );
                assert_eq!(got.family, family(&case.family));
            }
            (None, Some(python)) => {
                let err = load_config(case).expect_err(&case.name);
                assert!(
                    err.contains("preprocessor_config.json"),
                    "{}: {err}",
                    case.name
                );
                assert!(python.contains("shortest_edge"), "{}: {python}", case.name);
            }
            _ => panic!("{}: expect or error", case.name),
        }
    }
}

#[test]
fn placeholder_counts_match_transformers() {
    let g = goldens();
    let configs: std::collections::HashMap<&str, VisionConfig> = g
        .configs
        .iter()
        .filter(|c| c.expect.is_some())
        .map(|c| (c.name.as_str(), load_config(c).expect("config loads")))
        .collect();
    let mut checked = std::collections::HashMap::<&str, usize>::new();
    for case in &g.resize {
        let config = configs[case.config.as_str()];
        let what = format!("{} {}x{} (h x w)", case.config, case.height, case.width);
        let got = config.image_grid(case.height, case.width);
        match case.error.as_deref() {
            None => {
                let grid = got.unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(
                    Some([grid.resized_height, grid.resized_width]),
                    case.resized,
                    "{what}"
                );
                assert_eq!(Some(grid.thw()), case.grid_thw, "{what}");
                assert_eq!(Some(grid.pad_count), case.pad_count, "{what}");
                *checked.entry(case.config.as_str()).or_default() += 1;
            }
            Some("aspect_ratio") => {
                assert!(
                    matches!(got, Err(ResizeError::AspectRatio { .. })),
                    "{what}: {got:?}"
                )
            }
            Some("zero_size") => {
                assert!(
                    matches!(got, Err(ResizeError::ZeroSize { .. })),
                    "{what}: {got:?}"
                )
            }
            Some(other) => panic!("{what}: unknown error kind {other}"),
        }
    }
    assert!(
        checked["qwen2_vl"] >= 20 && checked["qwen3_vl"] >= 20,
        "{checked:?}"
    );
}

#[test]
fn placeholder_text_repeats_the_pad() {
    let config = VisionConfig::defaults(VisionFamily::Qwen2Vl);
    let text = config.placeholder(768, 1024).expect("placeholder");
    assert!(text.starts_with(VISION_START) && text.ends_with(VISION_END));
    assert_eq!(text.matches(IMAGE_PAD).count(), 999);
    assert_eq!(
        image_placeholder(2),
        "<|vision_start|><|image_pad|><|image_pad|><|vision_end|>"
    );
}

#[test]
fn a_missing_config_names_the_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = VisionConfig::from_model_dir(VisionFamily::Qwen3Vl, dir.path())
        .expect_err("no config")
        .to_string();
    assert!(err.contains("preprocessor_config.json"), "{err}");
    std::fs::write(dir.path().join("preprocessor_config.json"), "{not json").expect("write");
    let err = VisionConfig::from_model_dir(VisionFamily::Qwen3Vl, dir.path())
        .expect_err("bad json")
        .to_string();
    assert!(err.contains("not JSON"), "{err}");
}

// --- Decoding -------------------------------------------------------------

fn encode(img: &DynamicImage, format: ImageFormat) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, format).expect("encode");
    out.into_inner()
}

fn rgb(width: u32, height: u32) -> DynamicImage {
    DynamicImage::ImageRgb8(RgbImage::from_pixel(width, height, Rgb([200, 30, 90])))
}

fn data_url(mime: &str, bytes: &[u8]) -> String {
    format!(
        "data:{mime};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

fn limits() -> ImageLimits {
    ImageLimits::default()
}

#[test]
fn a_1x1_png_data_url_decodes() {
    let png = encode(&rgb(1, 1), ImageFormat::Png);
    let img = parse_image_url(&data_url("image/png", &png), &limits()).expect("png");
    assert_eq!((img.mime, img.width, img.height), (ImageMime::Png, 1, 1));
    assert_eq!(img.sha256, hex::encode(Sha256::digest(&png)));
    assert_eq!(img.bytes, png);
    assert_eq!(img.exif_orientation, 1);
}

#[test]
fn jpeg_webp_and_gif_decode() {
    let jpeg = encode(&rgb(7, 5), ImageFormat::Jpeg);
    let img = parse_image_url(&data_url("image/jpeg", &jpeg), &limits()).expect("jpeg");
    assert_eq!((img.mime, img.width, img.height), (ImageMime::Jpeg, 7, 5));
    // image/jpg, a common client spelling, and an upper-case scheme and MIME.
    let url = data_url("IMAGE/JPG", &jpeg).replacen("data:", "DATA:", 1);
    assert_eq!(
        parse_image_url(&url, &limits()).expect("jpg").mime,
        ImageMime::Jpeg
    );

    let webp = encode(&rgb(3, 4), ImageFormat::WebP);
    let img = parse_image_url(&data_url("image/webp", &webp), &limits()).expect("webp");
    assert_eq!((img.mime, img.width, img.height), (ImageMime::Webp, 3, 4));

    let gif = animated_gif();
    let img = parse_image_url(&data_url("image/gif", &gif), &limits()).expect("gif");
    assert_eq!((img.mime, img.width, img.height), (ImageMime::Gif, 6, 4));
    assert_eq!(img.sha256, hex::encode(Sha256::digest(&gif)));
}

/// Two frames of a 6x4 GIF: only the first is decoded.
fn animated_gif() -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut enc = image::codecs::gif::GifEncoder::new(&mut out);
        let first = image::Frame::new(RgbaImage::from_pixel(6, 4, Rgba([255, 0, 0, 255])));
        let second = image::Frame::new(RgbaImage::from_pixel(6, 4, Rgba([0, 0, 255, 255])));
        enc.encode_frames([first, second]).expect("gif");
    }
    out
}

#[test]
fn exif_orientation_is_reported_not_applied() {
    // A big-endian TIFF block: one IFD entry, Orientation (0x0112) = 6.
    let exif = [
        b"MM\0\x2a".as_slice(),
        &[0, 0, 0, 8, 0, 1],
        &[0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 6, 0, 0],
        &[0, 0, 0, 0],
    ]
    .concat();
    let mut jpeg = Vec::new();
    let mut enc = image::codecs::jpeg::JpegEncoder::new(&mut jpeg);
    enc.set_exif_metadata(exif).expect("exif");
    enc.write_image(rgb(8, 2).as_bytes(), 8, 2, image::ExtendedColorType::Rgb8)
        .expect("jpeg");
    let img = decode_image(jpeg, "image/jpeg", &limits()).expect("jpeg");
    assert_eq!((img.width, img.height, img.exif_orientation), (8, 2, 6));
}

#[test]
fn messages_base64_sources_and_wrapped_base64_decode() {
    let png = encode(&rgb(2, 3), ImageFormat::Png);
    let b64 = base64::engine::general_purpose::STANDARD.encode(&png);
    let img = decode_base64_image(&b64, "image/png", &limits()).expect("base64");
    assert_eq!((img.width, img.height), (2, 3));
    // Line-wrapped and unpadded base64 both decode to the same bytes.
    let wrapped: String = b64
        .trim_end_matches('=')
        .as_bytes()
        .chunks(16)
        .map(|c| String::from_utf8_lossy(c).into_owned() + "\r\n")
        .collect();
    let again = decode_base64_image(&wrapped, "image/png", &limits()).expect("wrapped");
    assert_eq!(again.bytes, png);
}

fn refused(url: &str, limits: &ImageLimits) -> ImageError {
    parse_image_url(url, limits).expect_err(url.get(..60).unwrap_or(url))
}

#[test]
fn undecodable_bytes_are_refused() {
    let err = refused(
        &data_url("image/png", b"definitely not an image"),
        &limits(),
    );
    assert!(matches!(err, ImageError::UnknownFormat { .. }), "{err:?}");
    assert!(
        err.to_string().contains("not a PNG, JPEG, WebP or GIF"),
        "{err}"
    );
    // A PNG cut short: the magic is right, the pixels are not there.
    let png = encode(&rgb(64, 64), ImageFormat::Png);
    let err = refused(&data_url("image/png", &png[..png.len() / 2]), &limits());
    assert!(matches!(err, ImageError::Undecodable { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("image cannot be decoded as image/png"),
        "{err}"
    );
    assert_eq!(
        refused("data:image/png;base64,", &limits()),
        ImageError::Empty
    );
    let err = refused("data:image/png;base64,!!!!", &limits());
    assert!(matches!(err, ImageError::Base64(_)), "{err:?}");
}

#[test]
fn a_wrong_mime_is_refused() {
    let png = encode(&rgb(1, 1), ImageFormat::Png);
    let err = refused(&data_url("image/jpeg", &png), &limits());
    assert_eq!(
        err,
        ImageError::WrongMime {
            declared: ImageMime::Jpeg,
            actual: "image/png"
        }
    );
    assert_eq!(
        err.to_string(),
        "image is declared image/jpeg but its bytes are image/png"
    );
    // A format outside the four, declared as one of them.
    let bmp = [b"BM".as_slice(), &[0u8; 60]].concat();
    let err = refused(&data_url("image/png", &bmp), &limits());
    assert!(err.to_string().contains("its bytes are image/bmp"), "{err}");
    // A MIME outside the four.
    let err = refused(&data_url("image/bmp", &bmp), &limits());
    assert!(matches!(err, ImageError::UnsupportedMime { .. }), "{err:?}");
    assert!(
        err.to_string().contains("image/bmp is not supported"),
        "{err}"
    );
}

#[test]
fn over_the_pixel_limit_is_refused() {
    let png = encode(&rgb(100, 50), ImageFormat::Png);
    let tight = ImageLimits {
        max_pixels: 4999,
        ..limits()
    };
    let err = refused(&data_url("image/png", &png), &tight);
    assert_eq!(
        err.to_string(),
        "image is 100x50 = 5000 pixels, over the limit max_image_pixels = 4999"
    );
    let at = ImageLimits {
        max_pixels: 5000,
        ..limits()
    };
    assert!(parse_image_url(&data_url("image/png", &png), &at).is_ok());
}

#[test]
fn a_pixel_bomb_is_refused_from_its_header() {
    // A PNG that claims 100000x100000 and holds no pixels: refused as too
    // many pixels (not undecodable), so nothing was decoded.
    let err = refused(
        &data_url("image/png", &png_header(100_000, 100_000)),
        &limits(),
    );
    assert!(
        matches!(
            err,
            ImageError::TooManyPixels {
                width: 100_000,
                height: 100_000,
                ..
            }
        ),
        "{err:?}"
    );
}

/// A PNG of the given size (8-bit RGB) whose pixel data is two bytes of a
/// zlib header: its header decodes, its pixels never could.
fn png_header(width: u32, height: u32) -> Vec<u8> {
    let mut ihdr = width.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    for (kind, data) in [
        (b"IHDR", ihdr.as_slice()),
        (b"IDAT", &[0x78, 0x9c]),
        (b"IEND", &[]),
    ] {
        let mut chunk = kind.to_vec();
        chunk.extend_from_slice(data);
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(&chunk);
        out.extend_from_slice(&crc32(&chunk).to_be_bytes());
    }
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn over_the_byte_limit_is_refused() {
    let png = encode(&rgb(16, 16), ImageFormat::Png);
    let tight = ImageLimits {
        max_bytes: png.len() - 1,
        ..limits()
    };
    let want = format!(
        "image is {} bytes, over the limit max_image_bytes = {}",
        png.len(),
        png.len() - 1
    );
    // From the base64 length, before decoding; and on raw bytes.
    assert_eq!(
        refused(&data_url("image/png", &png), &tight).to_string(),
        want
    );
    let err = decode_image(png.clone(), "image/png", &tight).expect_err("bytes");
    assert_eq!(err.to_string(), want);
    let exact = ImageLimits {
        max_bytes: png.len(),
        ..limits()
    };
    assert!(parse_image_url(&data_url("image/png", &png), &exact).is_ok());
}

#[test]
fn urls_are_not_fetched() {
    for url in [
        "https://example.com/cat.png",
        "http://127.0.0.1:9/x.png",
        "HTTPS://x",
    ] {
        let err = refused(url, &limits());
        assert!(
            matches!(err, ImageError::FetchDisabled { .. }),
            "{url}: {err:?}"
        );
        assert!(err.to_string().contains("fetching is off"), "{err}");
    }
    for url in ["file:///etc/passwd", "", "iVBORw0KGgo", "ftp://x/y.png"] {
        let err = refused(url, &limits());
        assert!(
            matches!(err, ImageError::UnsupportedUrl { .. }),
            "{url}: {err:?}"
        );
    }
    let err = refused("data:image/png,rawbytes", &limits());
    assert!(matches!(err, ImageError::NotBase64 { .. }), "{err:?}");
    let err = refused("data:image/png;base64", &limits());
    assert!(matches!(err, ImageError::MalformedDataUrl(_)), "{err:?}");
}

#[test]
fn errors_echo_little_of_the_input() {
    let long = format!("file://{}", "a".repeat(10_000));
    let msg = refused(&long, &limits()).to_string();
    assert!(msg.len() < 200, "{msg}");
    let msg = refused(
        &format!("data:image/{};base64,AAAA", "x".repeat(5000)),
        &limits(),
    )
    .to_string();
    assert!(msg.len() < 200, "{msg}");
}
