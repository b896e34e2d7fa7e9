"""`GET /v1/export?pixel_values=true` against transformers' own numbers:
`tito serve` with `[model] vision = "qwen2_vl"` in front of an SGLang mock
records calls whose prompts hold images of several sizes and formats (one
below min_pixels, one 50:1, one shrunk far more in height than in width,
three at and past the switch of Pillow's resize pass order,
RGBA, greyscale and palette PNGs, a lossy WebP, a GIF; then JPEGs: a large
one, an EXIF-rotated one, a greyscale one, a progressive one and 4:2:2 and
4:4:4 ones), and the exported `pixel_values` (JSONL and Parquet,
trajectory and verl layouts) must equal, bit for bit as float32, what
`Qwen2VLImageProcessorPil` computes from the same bytes as `load_image`
opens them, with the same preprocessor config; `image_grid_thw` must be the
processor's too.
"""

import base64
import io
import json
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from openai import OpenAI
from PIL import Image
from transformers.image_utils import load_image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize

import harness
from test_vision_agents import TEMPLATE, SglangMock

# A Qwen2-VL preprocessor_config.json's keys, max_pixels lowered so the
# large images are shrunk and the rows stay a few MB.
PREPROCESSOR = {"min_pixels": 3136, "max_pixels": 200704, "patch_size": 14, "temporal_patch_size": 2,
                "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
                "image_std": [0.26862954, 0.26130258, 0.27577711], "rescale_factor": 0.00392156862745098,
                "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor"}
DIM = 3 * 2 * 14 * 14


def picture(w, h, seed, mode="RGB"):
    """Smooth gradients plus noise: edges and flat parts for the resize."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / max(w - 1, 1), y * 255 / max(h - 1, 1), (x + y) % 256], axis=-1)
    noise = rng.integers(-40, 40, (h, w, 3))
    rgb = np.clip(base + noise, 0, 255).astype(np.uint8)
    im = Image.fromarray(rgb, "RGB")
    if mode == "RGBA":
        alpha = Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8), "L")
        im.putalpha(alpha)
    elif mode in ("L", "P"):
        im = im.convert(mode)
    return im


def encode(im, fmt, **kw):
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


def exif_rotated_jpeg():
    im = picture(300, 200, 5)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: shown rotated a quarter turn
    return encode(im, "JPEG", quality=90, exif=exif.tobytes())


# Decoded as Pillow decodes them (PNG, WebP, GIF), so bit-exact after the resize.
IMAGES = [
    ("tiny png, below min_pixels", "image/png", lambda: encode(picture(20, 15, 1), "PNG")),
    ("50:1 png", "image/png", lambda: encode(picture(600, 12, 2), "PNG")),
    ("tall png shrunk far more in height", "image/png", lambda: encode(picture(100, 3000, 3), "PNG")),
    # Resize pass order (ORDER_CASES): exactly at Pillow's switch, one past it.
    ("png at the pass-order switch", "image/png", lambda: encode(picture(285, 234, 15), "PNG")),
    ("png one row past it", "image/png", lambda: encode(picture(285, 235, 16), "PNG")),
    ("png whose width grows as its height shrinks", "image/png", lambda: encode(picture(266, 238, 17), "PNG")),
    ("rgba png", "image/png", lambda: encode(picture(90, 70, 6, "RGBA"), "PNG")),
    ("greyscale png", "image/png", lambda: encode(picture(64, 90, 7, "L"), "PNG")),
    ("palette png", "image/png", lambda: encode(picture(120, 80, 8, "P"), "PNG")),
    ("lossy webp", "image/webp", lambda: encode(picture(160, 120, 9), "WEBP", quality=80)),
    ("gif", "image/gif", lambda: encode(picture(150, 100, 10, "P"), "GIF")),
]
JPEGS = [
    ("large jpeg", "image/jpeg", lambda: encode(picture(1000, 700, 4), "JPEG", quality=85)),
    ("exif-rotated jpeg", "image/jpeg", exif_rotated_jpeg),
    ("greyscale jpeg, not resized", "image/jpeg", lambda: encode(picture(280, 224, 4, "L"), "JPEG")),
    ("progressive 4:2:0 jpeg, odd size", "image/jpeg",
     lambda: encode(picture(333, 251, 11), "JPEG", quality=75, progressive=True)),
    ("4:2:2 jpeg, odd size", "image/jpeg", lambda: encode(picture(301, 199, 12), "JPEG", subsampling=1)),
    ("4:4:4 jpeg", "image/jpeg", lambda: encode(picture(250, 180, 13), "JPEG", quality=95, subsampling=0)),
]


# (width, height, seed, vertical pass first) of the pass-order images above:
# Pillow (Resample.c, ImagingResampleInner) runs the vertical pass first when
# the height loses rows and more than twice the columns the width loses.
ORDER_CASES = [(100, 3000, 3, True), (285, 234, 15, False), (285, 235, 16, True), (266, 238, 17, True)]


def test_pass_order_cases_tell_the_orders_apart():
    """Pillow's own resize of each pass-order image is the order named, and
    the other order gives other bytes, so the export test can tell them apart."""
    for w, h, seed, vertical_first in ORDER_CASES:
        rh, rw = smart_resize(h, w, 28, PREPROCESSOR["min_pixels"], PREPROCESSOR["max_pixels"])
        im = picture(w, h, seed)
        got = np.asarray(im.resize((rw, rh), Image.BICUBIC))
        h_first = np.asarray(im.resize((rw, h), Image.BICUBIC).resize((rw, rh), Image.BICUBIC))
        v_first = np.asarray(im.resize((w, rh), Image.BICUBIC).resize((rw, rh), Image.BICUBIC))
        assert not np.array_equal(h_first, v_first), (w, h)
        assert np.array_equal(got, v_first if vertical_first else h_first), (w, h)


@pytest.fixture(scope="module")
def model_dir():
    tmp = Path(tempfile.mkdtemp(prefix="tito-pixels-"))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(harness.QWEN3 / f, tmp / f)
    (tmp / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    yield tmp
    shutil.rmtree(tmp)


def reference(images):
    """transformers' pixel values and grids for the images' bytes."""
    config = {k: v for k, v in PREPROCESSOR.items() if k not in ("image_processor_type", "processor_class")}
    processor = Qwen2VLImageProcessorPil(**config)
    pil = [load_image(base64.b64encode(b).decode()) for b in images]
    out = processor(images=pil, return_tensors="np")
    return out["pixel_values"], out["image_grid_thw"].tolist()


def get(url):
    with urllib.request.urlopen(url) as r:
        return r.read()


def mismatches(got, want, grids, names):
    """Per image: where the first differing value is, or None."""
    report, at = [], 0
    for name, (t, h, w) in zip(names, grids):
        n = t * h * w
        g, x = got[at:at + n], want[at:at + n]
        if g.shape != x.shape or not np.array_equal(g, x):
            diff = np.argwhere(g != x) if g.shape == x.shape else None
            where = diff[0].tolist() if diff is not None and len(diff) else "shape"
            report.append(f"{name}: {len(diff) if diff is not None else '?'} values differ, first at {where}"
                          + (f" ({g[tuple(diff[0])]!r} vs {x[tuple(diff[0])]!r})" if diff is not None and len(diff) else ""))
        at += n
    return report


@pytest.fixture(scope="module")
def gateway(model_dir):
    tok = harness.qwen3_tokenizer()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    mock = SglangMock([harness.pieces(tok, ["Some ", "pictures."]) + [im_end]] * 3)
    extra = f'chat_template = "{TEMPLATE}"\nvision = "qwen2_vl"\nmax_model_len = 16384'
    proc, addr = harness.start_tito(model_dir, f"http://{mock.addr}", model_extra=extra, kind="sglang")
    yield addr
    proc.terminate()
    proc.wait(timeout=30)
    mock.close()


def check(addr, tid, cases):
    """Records one call with `cases`' images; every export of it carries
    transformers' pixel values and grids."""
    names = [n for n, _, _ in cases]
    images = [make() for _, _, make in cases]
    parts = [{"type": "text", "text": "Describe these."}] + [
        {"type": "image_url", "image_url": {"url": f"data:{mime};base64," + base64.b64encode(b).decode()}}
        for (_, mime, _), b in zip(cases, images)]
    client = OpenAI(base_url=f"http://{addr}/t/{tid}/v1", api_key="unused")
    reply = client.chat.completions.create(model="test-model", messages=[{"role": "user", "content": parts}])
    assert reply.choices[0].message.content == "Some pictures."

    want, grids = reference(images)
    assert want.dtype == np.float32 and want.shape[1] == DIM

    # JSONL: base64 of the float32 little-endian matrix, and its shape.
    (line,) = get(f"http://{addr}/v1/export?trajectory={tid}&pixel_values=true").splitlines()
    row = json.loads(line)
    assert row["image_grid_thw"] == grids
    assert row["pixel_values_shape"] == list(want.shape)
    got = np.frombuffer(base64.b64decode(row["pixel_values"]), dtype="<f4").reshape(row["pixel_values_shape"])
    report = mismatches(got, want, grids, names)
    assert not report, report
    assert np.array_equal(got, want)

    # Parquet, and the verl layout with images by reference: the same values.
    for query in ("format=parquet", "format=parquet&layout=verl&prompt_length=4096&response_length=16&images=ref"):
        table = pq.read_table(io.BytesIO(get(f"http://{addr}/v1/export?trajectory={tid}&pixel_values=true&{query}")))
        (prow,) = table.to_pylist()
        assert prow["image_grid_thw"] == grids
        assert prow["pixel_values_shape"] == list(want.shape)
        pv = np.frombuffer(prow["pixel_values"], dtype="<f4").reshape(prow["pixel_values_shape"])
        assert np.array_equal(pv, want), query
        if "images=ref" in query:
            assert prow["images"] == [None] * len(images)


def test_png_webp_and_gif_pixel_values_are_transformers_own(gateway):
    check(gateway, "pix-png", IMAGES)
    # Not asked for: no such columns; a bad value is a 400.
    plain = json.loads(get(f"http://{gateway}/v1/export?trajectory=pix-png"))
    assert "pixel_values" not in plain and "pixel_values_shape" not in plain
    with pytest.raises(urllib.error.HTTPError) as e:
        get(f"http://{gateway}/v1/export?trajectory=pix-png&pixel_values=maybe")
    assert e.value.code == 400


def test_jpeg_pixel_values_are_transformers_own(gateway):
    check(gateway, "pix-jpeg", JPEGS)


def test_cmyk_jpeg_has_no_pixel_values(gateway):
    """Pillow converts CMYK itself; the export gives null, not other values."""
    cmyk = encode(picture(64, 48, 14).convert("CMYK"), "JPEG")
    parts = [{"type": "text", "text": "Describe this."},
             {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(cmyk).decode()}}]
    client = OpenAI(base_url=f"http://{gateway}/t/pix-cmyk/v1", api_key="unused")
    reply = client.chat.completions.create(model="test-model", messages=[{"role": "user", "content": parts}])
    assert reply.choices[0].message.content == "Some pictures."
    row = json.loads(get(f"http://{gateway}/v1/export?trajectory=pix-cmyk&pixel_values=true"))
    assert row["pixel_values"] is None and row["pixel_values_shape"] is None
    assert row["image_grid_thw"] == [[1, 4, 4]]
