"""verl's agent loop with images: `tito.verl.TitoAgentLoop` runs an OpenAI
SDK agent whose prompt carries one image and whose tool result carries a
second, against `tito serve` with a Qwen-VL model in front of an SGLang
mock. The `AgentLoopOutput` carries the sample's ids verbatim and
`multi_modal_data = {"images": [...]}` with both images, pixel for pixel,
in placeholder order (what verl's processor recomputes `multi_modal_inputs`
from: the grids it gives match the placeholder runs); a `response_length`
that ends inside the tool result's image run cuts before the run and
leaves that image out."""

import asyncio
import io

from openai import OpenAI
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

import harness
import tito_rl_support  # noqa: F401  (puts python/src on sys.path)
import tito  # noqa: E402
import tito.verl  # noqa: E402
from test_vision_agents import (PAD, PREPROCESSOR, ZOOM, SglangMock, data_url, gateway,
                                model_dir, png, runs, tok)

__all__ = ["model_dir", "tok"]  # pytest fixtures used here


def agent_with(a, b):
    def agent(base_url, task, api_key):
        client = OpenAI(base_url=base_url, api_key=api_key)
        msgs = [{"role": "user", "content": [{"type": "text", "text": task["question"]},
                                             {"type": "image_url", "image_url": {"url": data_url(a)}}]}]
        first = client.chat.completions.create(model="test-model", messages=msgs, tools=ZOOM).choices[0]
        (tc,) = first.message.tool_calls
        msgs.append(first.message.model_dump(exclude_none=True))
        msgs.append({"role": "tool", "tool_call_id": tc.id, "content": [
            {"type": "text", "text": "zoomed:"}, {"type": "image_url", "image_url": {"url": data_url(b)}}]})
        second = client.chat.completions.create(model="test-model", messages=msgs, tools=ZOOM).choices[0]
        return 1.0 if second.message.content == "A cat." else 0.0
    return agent


def pixels(im):
    return im.convert("RGB").tobytes(), im.size


def test_the_verl_agent_loop_hands_verl_the_images_of_the_sample(tok, model_dir):
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    pad = tok.convert_tokens_to_ids(PAD)
    call = harness.pieces(tok, ["<tool_call>", '\n{"name": "zoom", "arguments": {"factor": 2}}\n',
                                "</tool_call>"])
    answer = harness.pieces(tok, ["A ", "cat", "."]) + [im_end]
    mock = SglangMock([call + [im_end], answer] * 2)
    proc, addr = gateway(model_dir, mock)
    try:
        a, b = png(64, 48, (200, 10, 10)), png(100, 60, (10, 200, 10))
        loop = tito.verl.TitoAgentLoop(gateway=f"http://{addr}", agent=agent_with(a, b),
                                       response_length=512)
        out = asyncio.run(loop.run({"temperature": 1.0}, question="What is in this picture?",
                                   uid="vis-verl-1"))
        assert out.reward_score == 1.0
        assert runs(out.prompt_ids + out.response_ids, pad) == [4, 8]
        assert all(m == 0 for t, m in zip(out.response_ids, out.response_mask) if t == pad)
        images = out.multi_modal_data["images"]
        assert [pixels(im) for im in images] == [pixels(Image.open(io.BytesIO(x))) for x in (a, b)]
        # verl's processor, run on these images, gives the grids of the runs.
        processor = Qwen2VLImageProcessorPil(
            **{k: v for k, v in PREPROCESSOR.items() if k != "image_processor_type"})
        grids = processor(images=images)["image_grid_thw"]
        merge = PREPROCESSOR["merge_size"] ** 2
        assert [int(g[0] * g[1] * g[2]) // merge for g in grids] == [4, 8]

        # A response_length ending inside the second image's run: the cut
        # moves to where the run starts, and that image is left out.
        seq = out.prompt_ids + out.response_ids
        start = next(i for i in range(len(out.prompt_ids), len(seq)) if seq[i] == pad)
        inside = start - len(out.prompt_ids) + 3
        loop = tito.verl.TitoAgentLoop(gateway=f"http://{addr}", agent=agent_with(a, b),
                                       response_length=inside)
        cut = asyncio.run(loop.run({"temperature": 1.0}, question="What is in this picture?",
                                   uid="vis-verl-2"))
        assert cut.prompt_ids == out.prompt_ids
        assert cut.response_ids == out.response_ids[:start - len(out.prompt_ids)]
        assert pad not in cut.response_ids
        assert [pixels(im) for im in cut.multi_modal_data["images"]] == [pixels(images[0])]
        assert cut.extra_fields["tito_truncated"] is True
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        mock.close()
