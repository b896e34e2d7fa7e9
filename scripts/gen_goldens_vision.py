#!/usr/bin/env python3
"""Writes tests/fixtures/goldens/vision.json: Qwen-VL image placeholder
counts from transformers' own image processor, the reference of
src/render/vision.rs (checked by tests/render_vision.rs).

Qwen2-VL, Qwen2.5-VL and Qwen3-VL all load `Qwen2VLImageProcessor`
(transformers/models/auto/image_processing_auto.py maps qwen2_vl, qwen2_5_vl
and qwen3_vl to it); Qwen3-VL differs only in its preprocessor_config.json.
That class's module imports torch, which this venv lacks, so the goldens come
from its PIL twin `Qwen2VLImageProcessorPil`, whose `smart_resize` is marked
"Copied from" the torch module's; the script checks the two function sources
are identical before using it.

{"configs": [...], "resize": [...]}:
- configs: a model directory's files and what the processor loaded from them
  (`from_pretrained`): patch_size, merge_size, temporal_patch_size and
  min_pixels / max_pixels (its size.shortest_edge / size.longest_edge), or
  `error` where transformers refuses them (at load or at its first image).
- resize: an image (height, width) under a config: `resized` is smart_resize's
  (height, width), `grid_thw` the processor's image_grid_thw, `pad_count`
  grid_t*grid_h*grid_w // merge_size**2 (Qwen2VLProcessor's count of
  <|image_pad|>), or `error` (aspect_ratio / zero_size) where transformers
  raises. `preprocessed` says the processor also ran on a blank image of that
  size and gave the same grid.

Run: scripts/setup-python.sh && .venv/bin/python scripts/gen_goldens_vision.py
"""

import ast
import inspect
import json
import math
import tempfile
from pathlib import Path

import transformers
from PIL import Image
from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil_mod
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests/fixtures/goldens/vision.json"

# The shipped preprocessor_config.json of each family's checkpoints
# (Qwen/Qwen2-VL-7B-Instruct and Qwen/Qwen2.5-VL-7B-Instruct: top-level
# min/max_pixels; Qwen/Qwen3-VL-8B-Instruct: `size`), normalization keys cut.
QWEN2_VL = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_processor_type": "Qwen2VLImageProcessor",
}
QWEN2_5_VL = dict(QWEN2_VL, processor_class="Qwen2_5_VLProcessor")
QWEN3_VL = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "processor_class": "Qwen3VLProcessor",
}

# name -> (family, {file name: contents})
CONFIGS = {
    "qwen2_vl": ("qwen2_vl", {"preprocessor_config.json": QWEN2_VL}),
    "qwen2_5_vl": ("qwen2_vl", {"preprocessor_config.json": QWEN2_5_VL}),
    "qwen3_vl": ("qwen3_vl", {"preprocessor_config.json": QWEN3_VL}),
    # No keys: the class defaults, for either family (Qwen3-VL has no image
    # processor class of its own, so its defaults are Qwen2-VL's too).
    "qwen2_vl_defaults": ("qwen2_vl", {"preprocessor_config.json": {}}),
    "qwen3_vl_defaults": ("qwen3_vl", {"preprocessor_config.json": {}}),
    # Top-level min/max_pixels override `size`.
    "min_max_over_size": (
        "qwen2_vl",
        {"preprocessor_config.json": {"size": {"shortest_edge": 1000, "longest_edge": 2000000}, "min_pixels": 4000,
                                      "max_pixels": 3000000}},
    ),
    # `size` replaces the default dict whole; min_pixels fills its hole.
    "size_partial_plus_min": (
        "qwen2_vl",
        {"preprocessor_config.json": {"size": {"longest_edge": 2000000}, "min_pixels": 5000}},
    ),
    # The nested processor_config.json wins over preprocessor_config.json.
    "nested_processor_config": (
        "qwen3_vl",
        {
            "processor_config.json": {"image_processor": QWEN3_VL, "processor_class": "Qwen3VLProcessor"},
            "preprocessor_config.json": QWEN2_VL,
        },
    ),
    # processor_config.json without an image_processor key: ignored.
    "flat_processor_config": (
        "qwen2_vl",
        {"processor_config.json": {"processor_class": "Qwen2VLProcessor"}, "preprocessor_config.json": QWEN2_VL},
    ),
    # Refused: a `size` without shortest_edge, and a zero max.
    "size_without_shortest_edge": ("qwen2_vl", {"preprocessor_config.json": {"size": {"longest_edge": 2000000}}}),
    "zero_max_pixels": ("qwen2_vl", {"preprocessor_config.json": dict(QWEN2_VL, max_pixels=0)}),
}

# (height, width), each run under both shipped families' configs.
COMMON_SIZES = [
    # Tiny, below min_pixels: scaled up by the ceil branch.
    (1, 1), (10, 10), (1, 2), (2, 1), (7, 13), (27, 27), (28, 28), (29, 29), (31, 33), (32, 32), (55, 57),
    # Extreme aspect ratios at and past 200:1.
    (1, 200), (200, 1), (1, 201), (201, 1), (10, 2000), (2000, 10), (10, 2001), (3, 600), (50, 10000),
    (10000, 50), (33, 6600), (33, 6601),
    # Everyday sizes.
    (480, 640), (640, 480), (375, 500), (768, 1024), (1024, 768), (1080, 1920), (1920, 1080), (3024, 4032),
    (224, 224), (336, 336), (448, 448), (512, 512), (1000, 1000), (999, 1001),
    # Huge: past max_pixels, shrunk by the floor branch.
    (10000, 8000), (8000, 10000), (16384, 16384), (20000, 100), (100, 20000), (50000, 250), (12345, 6789),
    # Zero.
    (0, 10), (10, 0), (0, 0),
]

# Per family: exact multiples of the factor, round-half-even ties of
# height/factor, and sizes around min_pixels and max_pixels.
FAMILY_SIZES = {
    "qwen2_vl": [
        (280, 560), (28, 5600), (56, 56), (84, 28), (2800, 1400),
        # 70/28 = 2.5 and 126/28 = 4.5 round down to even; 42/28 = 1.5 and 98/28 = 3.5 up.
        (70, 700), (126, 700), (42, 700), (98, 700), (14, 700), (700, 70), (630, 1470),
        # min_pixels 3136 = 56x56.
        (55, 56), (56, 57), (40, 78), (41, 77), (78, 41),
        # max_pixels 12845056 = 3584x3584.
        (3584, 3584), (3583, 3584), (3585, 3584), (3590, 3590), (3598, 3570), (3600, 3600), (2000, 6423),
        (2000, 6430), (3571, 3597),
    ],
    "qwen3_vl": [
        (320, 640), (32, 6400), (256, 256), (96, 32), (3200, 1600),
        # 80/32 = 2.5 and 144/32 = 4.5 round down to even; 48/32 = 1.5 and 112/32 = 3.5 up.
        (144, 1440), (80, 1440), (48, 1440), (112, 1440), (16, 1440), (1440, 144), (720, 1680),
        # min_pixels 65536 = 256x256.
        (255, 256), (256, 257), (240, 272), (200, 328), (328, 200), (255, 255),
        # max_pixels 16777216 = 4096x4096.
        (4096, 4096), (4095, 4096), (4097, 4096), (4100, 4100), (4112, 4080), (4080, 4112), (2048, 8192),
        (2048, 8200), (4111, 4081),
    ],
}

# The class-default config (max_pixels 1003520): a few sizes across its max.
DEFAULT_SIZES = [(1, 1), (768, 1024), (1080, 1920), (1000, 1003), (1002, 1002), (10000, 8000)]

# Cheap enough to also run the full processor on a blank image.
PREPROCESS_MAX_PIXELS = 2_100_000


def function_source(path, name):
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(Path(path).read_text(encoding="utf-8"), node)
    raise SystemExit(f"{path}: no function {name}")


def check_smart_resize_is_the_torch_modules():
    torch_path = Path(pil_mod.__file__).with_name("image_processing_qwen2_vl.py")
    want = function_source(torch_path, "smart_resize")
    got = inspect.getsource(smart_resize).strip()
    if want.strip() != got:
        raise SystemExit("the PIL module's smart_resize is not the torch module's: goldens would not be transformers'")


def load_config(files):
    with tempfile.TemporaryDirectory() as d:
        for name, body in files.items():
            (Path(d) / name).write_text(json.dumps(body), encoding="utf-8")
        proc = Qwen2VLImageProcessorPil.from_pretrained(d)
    # A bad size dict only fails on the first image: run one to see it.
    proc(images=[Image.new("RGB", (64, 64))])
    return proc


def config_case(name, family, files):
    case = {"name": name, "family": family, "files": files}
    try:
        proc = load_config(files)
    except (ValueError, OSError) as e:
        case["error"] = str(e)
        return case, None
    case["expect"] = {
        "patch_size": proc.patch_size,
        "merge_size": proc.merge_size,
        "temporal_patch_size": proc.temporal_patch_size,
        "min_pixels": proc.size.shortest_edge,
        "max_pixels": proc.size.longest_edge,
    }
    return case, proc


def resize_case(config, proc, height, width):
    case = {"config": config, "height": height, "width": width}
    factor = proc.patch_size * proc.merge_size
    try:
        resized = smart_resize(height, width, factor, proc.size.shortest_edge, proc.size.longest_edge)
    except ValueError as e:
        case["error"] = "aspect_ratio"
        case["message"] = str(e)
        return case
    except ZeroDivisionError as e:
        case["error"] = "zero_size"
        case["message"] = str(e)
        return case
    patches = proc.get_number_of_image_patches(height, width, {})
    grid = [1, resized[0] // proc.patch_size, resized[1] // proc.patch_size]
    assert grid[1] * grid[2] == patches, (height, width)
    case["resized"] = list(resized)
    case["grid_thw"] = grid
    case["pad_count"] = math.prod(grid) // proc.merge_size**2
    case["preprocessed"] = False
    if height * width <= PREPROCESS_MAX_PIXELS and resized[0] * resized[1] <= 2 * PREPROCESS_MAX_PIXELS:
        out = proc(images=[Image.new("RGB", (width, height))])
        assert out["image_grid_thw"].tolist() == [grid], (height, width, out["image_grid_thw"])
        assert out["pixel_values"].shape[0] == math.prod(grid)
        case["preprocessed"] = True
    return case


def main():
    check_smart_resize_is_the_torch_modules()
    configs, procs = [], {}
    for name, (family, files) in CONFIGS.items():
        case, proc = config_case(name, family, files)
        configs.append(case)
        if proc is not None:
            procs[name] = proc
    resize = []
    for config in ("qwen2_vl", "qwen3_vl"):
        for h, w in COMMON_SIZES + FAMILY_SIZES[config]:
            resize.append(resize_case(config, procs[config], h, w))
    for h, w in DEFAULT_SIZES:
        resize.append(resize_case("qwen2_vl_defaults", procs["qwen2_vl_defaults"], h, w))
    out = {
        "generator": "scripts/gen_goldens_vision.py",
        "transformers": transformers.__version__,
        "reference": "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl: Qwen2VLImageProcessorPil, "
        "smart_resize (identical to image_processing_qwen2_vl.smart_resize)",
        "configs": configs,
        "resize": resize,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    errors = sum("error" in c for c in resize)
    print(f"{OUT.relative_to(ROOT)}: {len(configs)} configs, {len(resize)} sizes ({errors} refused)")


if __name__ == "__main__":
    main()
