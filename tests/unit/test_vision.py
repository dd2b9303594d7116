"""Vision-language foundations: the tiny Qwen2.5-VL preset and its folder, prompts with images
(one image token per merged patch, where the chat template puts the image), images read from
records (paths, bytes, mappings) with every broken one named, and the counting task."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from rl_core.data.datasets import DataError, load_prompts, write_rows
from rl_core.data.images import image_refs, load_images
from rl_core.data.visual import CELL, GRID, QUESTION, write_squares
from rl_core.models.vision import (IMAGE_PAD, VISION_TOKENS, VL_VOCAB, ImagePrompter,
                                   build_tiny_vl)
from tests.ranks import spawn

MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Count."}]}]


def picture(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def tiny_vl():
    return build_tiny_vl("vl", seed=0)


# --------------------------------------------------------------------------- model and prompts


def test_the_image_tokens_stand_where_the_template_puts_the_image(tiny_vl):
    """A 56 x 56 picture is 16 patches of 14 pixels, merged 2 x 2 into 4 image tokens, right
    after <|vision_start|>; a 56 x 112 one is 8 tokens; the text around them is unchanged."""
    _, prompter = tiny_vl
    two = [{"role": "user", "content": [
        {"type": "text", "text": "A:"}, {"type": "image"}, {"type": "text", "text": "B:"},
        {"type": "image"}]}]
    text = prompter.tokenizer.apply_chat_template(two, add_generation_prompt=True, tokenize=False)
    prompt = prompter(text, [picture(56, 56), picture(112, 56, 1)])
    start, end, pad = (VL_VOCAB.index(t) for t in VISION_TOKENS)
    assert prompt.image_grid_thw.tolist() == [[1, 4, 4], [1, 4, 8]]
    assert prompt.pixel_values.shape == (16 + 32, 3 * 2 * 14 * 14)
    runs, i = [], 0
    while i < len(prompt.ids):
        if prompt.ids[i] == pad:
            j = i
            while prompt.ids[j] == pad:
                j += 1
            assert prompt.ids[i - 1] == start and prompt.ids[j] == end
            runs.append(j - i)
            i = j
        i += 1
    assert runs == [4, 8]
    without = [t for t in prompt.ids if t != pad]
    assert prompter.tokenizer.decode(without) == text.replace(IMAGE_PAD, "")
    with pytest.raises(ValueError, match="2 image slot\\(s\\) for 1 image"):
        prompter(text, [picture(56, 56)])


def test_the_model_reads_the_picture(tiny_vl):
    """The image tokens' embeddings come from the vision tower: another picture changes the
    logits of the positions after it, not before."""
    model, prompter = tiny_vl
    text = prompter.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True,
                                                  tokenize=False)
    logits = []
    for seed in (0, 1):
        prompt = prompter(text, [picture(56, 56, seed)])
        with torch.no_grad():
            logits.append(model(input_ids=torch.tensor([prompt.ids]),
                                pixel_values=prompt.pixel_values,
                                image_grid_thw=prompt.image_grid_thw).logits[0])
    first = prompt.ids.index(VL_VOCAB.index(IMAGE_PAD))
    assert torch.equal(logits[0][:first], logits[1][:first])
    assert not torch.allclose(logits[0][-1], logits[1][-1])


def test_tiny_vl_is_a_hugging_face_folder(tmp_path, monkeypatch):
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    from rl_core.errors import InputError
    from rl_core.models.loading import (check_model_folder, load_image_processor, load_model,
                                        resolve_model_path)

    monkeypatch.setenv("ASCENT_CACHE_DIR", str(tmp_path))
    folder = resolve_model_path("tiny:vl")
    assert resolve_model_path("tiny:vl") == folder  # built once
    model, prompter = build_tiny_vl("vl")
    loaded = AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True).eval()
    again = ImagePrompter(AutoTokenizer.from_pretrained(folder, local_files_only=True),
                          AutoImageProcessor.from_pretrained(folder, local_files_only=True))
    text = again.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True,
                                               tokenize=False)
    prompt, expected = again(text, [picture(56, 84)]), prompter(text, [picture(56, 84)])
    assert prompt.ids == expected.ids
    assert torch.equal(prompt.pixel_values, expected.pixel_values)
    inputs = {"input_ids": torch.tensor([prompt.ids]), "pixel_values": prompt.pixel_values,
              "image_grid_thw": prompt.image_grid_thw}
    with torch.no_grad():
        assert torch.allclose(loaded(**inputs).logits, model(**inputs).logits, atol=1e-6)
    assert type(load_model("tiny:vl")).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert load_image_processor("tiny:vl").merge_size == 2
    other = tmp_path / "llava"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "llava"}))
    with pytest.raises(InputError, match="a vision-language model of a kind rl_core does not "
                                         "train yet; supported: qwen2_5_vl"):
        check_model_folder(other)


# --------------------------------------------------------------------------- images of records


def test_images_come_from_paths_bytes_and_mappings(tmp_path):
    """Paths (relative to the data file, or absolute, alone or in a mapping) in jsonl; a list of
    bytes and Hugging Face's {bytes, path} structs in parquet; grey pictures come back RGB."""
    (tmp_path / "pics").mkdir()
    picture(30, 20).save(tmp_path / "pics" / "a.png")
    paths = write_rows([{"prompt": "p0", "answer": "1", "images": ["pics/a.png"]},
                        {"prompt": "p1", "answer": "2",
                         "images": {"path": str(tmp_path / "pics/a.png")}},
                        {"prompt": "p2", "answer": "3", "images": None}], tmp_path / "a.jsonl")
    raw = write_rows([{"prompt": "p3", "answer": "4",
                       "images": [png(picture(16, 16).convert("L")), png(picture(8, 8))]}],
                     tmp_path / "b.parquet")
    structs = write_rows([{"prompt": "p4", "answer": "5",
                           "image": {"bytes": png(picture(12, 6)), "path": "ignored.png"}}],
                         tmp_path / "c.parquet")
    records = (load_prompts(paths, image_key="images") + load_prompts(raw, image_key="images")
               + load_prompts(structs, image_key="image"))
    images = load_images(records, "training")
    assert [[im.size for im in row] for row in images] == [[(30, 20)], [(30, 20)], [],
                                                           [(16, 16), (8, 8)], [(12, 6)]]
    assert all(im.mode == "RGB" for row in images for im in row)
    assert load_prompts(paths)[0].images == ()  # no image key: text only
    with pytest.raises(TypeError, match="an image must be a path, bytes or a mapping"):
        image_refs([3])


def test_every_broken_image_is_named_with_its_record(tmp_path):
    (tmp_path / "ok.png").write_bytes(png(picture(8, 8)))
    (tmp_path / "broken.png").write_bytes(png(picture(8, 8))[:40])  # truncated
    rows = [{"prompt": "fine", "answer": "0", "images": ["ok.png"]},
            {"prompt": "missing", "answer": "0", "images": ["nowhere.png"]},
            {"prompt": "truncated", "answer": "0", "images": ["ok.png", "broken.png"]},
            {"prompt": "too many", "answer": "0", "images": ["ok.png"] * 9}]
    path = write_rows(rows, tmp_path / "data.jsonl")
    raw = write_rows([{"prompt": "not a picture", "answer": "0", "images": [b"hello"]}],
                     tmp_path / "raw.parquet")
    records = load_prompts(path, image_key="images") + load_prompts(raw, image_key="images")
    with pytest.raises(DataError) as info:
        load_images(records, "validation")
    message = str(info.value)
    assert message.startswith("validation data: 4 image problem(s)")
    assert f"{path} line 2: image 0: {tmp_path}/nowhere.png: no such file" in message
    assert f"{path} line 3: image 1:" in message and "not a readable image" in message
    assert f"{path} line 4: 9 images, more than the limit of 8" in message
    assert f"{raw} row 0: image 0: the image's bytes is not a readable image" in message
    bad = [{"prompt": "x", "answer": "0", "images": 7}]
    with pytest.raises(DataError, match=r"field 'images' \(image_key\): expected an image"):
        load_prompts(write_rows(bad, tmp_path / "bad.jsonl"), image_key="images")


def test_a_picture_over_the_pixel_limit_is_refused_before_it_is_decoded(tmp_path, monkeypatch):
    import rl_core.data.images as images

    monkeypatch.setattr(images, "MAX_IMAGE_PIXELS", 100)
    path = write_rows([{"prompt": "x", "answer": "0", "images": [png(picture(11, 10))]}],
                      tmp_path / "data.parquet")
    with pytest.raises(DataError, match="is 11 x 10 pixels, more than the limit of 100"):
        load_images(load_prompts(path, image_key="images"), "training")


@pytest.mark.parametrize("sections,field,message", [
    ({"rollout": {"engine": "vllm"}}, "rollout.engine", "vLLM is not given the images yet"),
    ({"algorithm": "ppo", "critic": {"enable": True}}, "critic.enable",
     "the critic is a text model"),
    ({"rollout": {"partial_rollout_max_split": 2}}, "rollout.partial_rollout_max_split",
     "partial rollout resumes text contexts"),
    ({"data": {"synthetic": {"task": "squares"}, "image_key": "images"}}, "data.image_key",
     "the synthetic task names its own images"),
])
def test_what_image_prompts_cannot_do_yet_is_refused_naming_the_field(sections, field, message):
    from rl_core.spec import SpecError, resolve_spec

    spec = {"model": {"path": "tiny:vl"}, "data": {"synthetic": {"task": "squares"}}}
    for name, values in sections.items():
        spec[name] = {**spec.get(name, {}), **values} if isinstance(values, dict) else values
    with pytest.raises(SpecError, match=rf"{field}: .*{message}"):
        resolve_spec(spec)


def test_images_with_a_text_model_are_refused_at_admission_naming_model_path():
    from rl_core.admission import admit
    from rl_core.spec import resolve_spec

    refused = admit(resolve_spec({"model": {"path": "tiny:small"},
                                  "data": {"synthetic": {"task": "squares"}}})).refusals
    assert any(r["field"] == "model.path" and "reads text only" in r["message"] for r in refused)
    for model in ("tiny:vl", "tiny:vl-squares"):  # the warm start has its model's type
        assert admit(resolve_spec({"model": {"path": model},
                                   "data": {"synthetic": {"task": "squares"}}})).admitted, model


# --------------------------------------------------------------------------- passes with pixels


def image_prompts(prompter, specs):
    from rl_core.data.batch import PromptIds

    out = []
    for count, text, pictures in specs:
        messages = [{"role": "user", "content": [{"type": "image"}] * count
                     + [{"type": "text", "text": text}]}]
        rendered = prompter.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                          tokenize=False)
        prompt = prompter(rendered, pictures)
        out.append(PromptIds(prompt.ids, prompt))
    return out


SPECS = [(1, "Count", [picture(56, 56, 0)]), (2, "How many?", [picture(56, 84, 1),
                                                                picture(28, 28, 2)]),
         (1, "x", [picture(112, 56, 3)])]


def test_the_native_engine_generates_from_the_pictures_as_transformers_does():
    """Left-padded prompts of one and two pictures of three sizes: the same greedy tokens as
    transformers' generate on each alone; the batch carries each row's image columns with the
    image tokens where the prompter put them."""
    from rl_core.rollout.native import NativeRolloutEngine
    from rl_core.rollout.sampling import SamplingParams

    model, prompter = build_tiny_vl("vl", seed=1)
    prompts = image_prompts(prompter, SPECS)
    batch = NativeRolloutEngine(model, [258], 256).generate(
        prompts, SamplingParams(max_new_tokens=6, do_sample=False, n=2))
    grids = batch["image_grid_thw"].tolist()
    assert grids[0] == grids[1] == [[1, 4, 4], [0, 0, 0]]  # one picture, the row padded
    assert grids[2] == [[1, 6, 4], [1, 2, 2]] and grids[4] == [[1, 4, 8], [0, 0, 0]]
    pad = VL_VOCAB.index(IMAGE_PAD)
    for row in range(6):
        prompt = prompts[row // 2]
        ids = batch["prompt_ids"][row][batch["prompt_mask"][row].bool()].tolist()
        assert ids == list(prompt) and ids.count(pad) == sum(
            int(g.prod()) // 4 for g in prompt.image.image_grid_thw)
        patches = int(batch["image_grid_thw"][row].prod(-1).sum())
        assert torch.equal(batch["pixel_values"][row, :patches], prompt.image.pixel_values)
    for index, prompt in enumerate(prompts):
        seq = torch.tensor([list(prompt)])
        want = model.generate(input_ids=seq, pixel_values=prompt.image.pixel_values,
                              image_grid_thw=prompt.image.image_grid_thw,
                              mm_token_type_ids=(seq == pad).int(), max_new_tokens=6,
                              do_sample=False, eos_token_id=[258], pad_token_id=256)
        got = batch["response_ids"][2 * index][:int(batch["response_lengths"][2 * index])]
        assert got.tolist() == want[0, seq.shape[1]:].tolist()[:len(got)]


def test_the_training_forward_with_pixels_equals_each_row_alone():
    """Micro-batches of padded rows with pictures: each row's response log-probs equal
    transformers' forward on the row alone (its 3-D positions from its images), and a step
    trains on them."""
    from rl_core.data.prompts import response_batch
    from rl_core.engines.train import TrainEngine, token_logprobs

    model, prompter = build_tiny_vl("vl", seed=2)
    prompts = image_prompts(prompter, SPECS)
    responses = [[50, 51, 258], [52, 258], [53, 54, 55, 258]]
    batch = response_batch(prompts, responses, 256)
    data = batch.with_sequences()
    width = batch["response_ids"].shape[1]
    engine = TrainEngine(model, lr=1e-3, micro_batch_size=2)
    images = (data["pixel_values"], data["image_grid_thw"])
    logprobs, _ = engine.forward_logprobs(data["input_ids"], data["attention_mask"],
                                          data["position_ids"], width, images=images)
    pad = VL_VOCAB.index(IMAGE_PAD)
    for row, (prompt, response) in enumerate(zip(prompts, responses)):
        seq = torch.tensor([list(prompt) + response])
        with torch.no_grad():
            out = model(input_ids=seq, pixel_values=prompt.image.pixel_values,
                        image_grid_thw=prompt.image.image_grid_thw,
                        mm_token_type_ids=(seq == pad).int())
        want, _ = token_logprobs(out.logits[:, len(prompt) - 1:-1], seq[:, len(prompt):])
        assert torch.allclose(logprobs[row, :len(response)], want[0], atol=1e-5), row
    columns = {**data.to_dict(), "old_logprobs": logprobs,
               "advantages": torch.tensor([[1.0], [-1.0], [0.5]]).expand(3, width)}

    def loss_fn(micro, new, _entropy):
        mask = micro["response_mask"].float()
        return -(new * micro["advantages"] * mask).sum() / mask.sum(), {}

    before = model.model.visual.blocks[0].mlp.down_proj.weight.clone()
    assert engine.train_step(columns, loss_fn)["actor/grad_norm"] > 0
    assert not torch.equal(before, model.model.visual.blocks[0].mlp.down_proj.weight)


def test_a_rows_pictures_come_back_from_its_patches_as_the_model_saw_them():
    """The sample viewer's pictures: a row's patches (two pictures, padded) put back together
    equal the pictures the processor cut them from (sizes already multiples of 28)."""
    from rl_core.data.images import pictures_of

    _, prompter = build_tiny_vl("vl")
    pictures = [picture(84, 56, 4), picture(28, 28, 5)]
    out = prompter.image_processor(images=pictures, return_tensors="pt")
    pixels = torch.cat([out["pixel_values"], torch.zeros(5, out["pixel_values"].shape[1])])
    grids = torch.cat([out["image_grid_thw"], torch.zeros(1, 3, dtype=torch.long)])
    back = pictures_of(pixels, grids, prompter.image_processor)
    assert [b.size for b in back] == [(84, 56), (28, 28)]
    for want, got in zip(pictures, back):
        assert np.array_equal(np.asarray(want), np.asarray(got))


def test_packed_rows_with_pictures_equal_the_padded_rows():
    """Rows with one, two and no pictures packed into sequences (`actor.use_remove_padding`):
    each row's image tokens stay inside its row, its patches in row order and its 3-D
    positions its own, so the log-probs, the entropy and a step's gradients equal the padded
    forward's; the image encoder keeps its own boundaries (each picture's patches)."""
    import copy

    from rl_core.data.prompts import response_batch
    from rl_core.engines.train import TrainEngine
    from tests.unit.test_train_engine import assert_same_step, step_with_grads

    model, prompter = build_tiny_vl("vl", seed=3)
    prompts = image_prompts(prompter, SPECS + [(0, "No picture here", [])])
    responses = [[50, 51, 258], [52, 258], [53, 54, 55, 258], [56, 258]]
    data = response_batch(prompts, responses, 256).with_sequences()
    width = data["response_mask"].shape[1]
    images = (data["pixel_values"], data["image_grid_thw"])
    padded = TrainEngine(model, lr=1e-6, micro_batch_size=2)  # see assert_same_step
    packed = TrainEngine(copy.deepcopy(model), lr=1e-6, micro_batch_size=2,
                         remove_padding=True)
    args = (data["input_ids"], data["attention_mask"], data["position_ids"], width)
    want, want_entropy = padded.forward_logprobs(*args, with_entropy=True, images=images)
    got, entropy = packed.forward_logprobs(*args, with_entropy=True, images=images)
    mask = data["response_mask"].bool()
    assert torch.allclose(got[mask], want[mask], atol=1e-5)
    assert torch.allclose(entropy[mask], want_entropy[mask], atol=1e-5)
    assert torch.all(got[~mask] == 0)
    columns = {**data.to_dict(), "old_logprobs": want,
               "advantages": torch.tensor([[1.0], [-1.0], [0.5], [0.25]]).expand(4, width)}

    def loss_fn(micro, new, _entropy):
        mask = micro["response_mask"].float()
        return -(new * micro["advantages"] * mask).sum() / mask.sum(), {}

    metrics, grads = step_with_grads(padded, columns, loss_fn)
    _, packed_grads = step_with_grads(packed, columns, loss_fn)
    assert metrics["actor/grad_norm"] > 0
    assert_same_step(padded, packed, grads, packed_grads)


def vl_batch(seed: int):
    """A tiny VL model and a 4-row batch (one, two, one and no pictures) with old log-probs off
    the policy and advantages, for a PPO-style step."""
    from rl_core.data.prompts import response_batch
    from rl_core.engines.train import TrainEngine

    model, prompter = build_tiny_vl("vl", seed=seed)
    prompts = image_prompts(prompter, SPECS + [(0, "No picture here", [])])
    data = response_batch(prompts, [[50, 51, 258], [52, 258], [53, 54, 55, 258], [56, 258]],
                          256).with_sequences()
    width = data["response_mask"].shape[1]
    batch = data.to_dict()
    with torch.no_grad():
        old, _ = TrainEngine(model, lr=1e-6).forward_logprobs(
            batch["input_ids"], batch["attention_mask"], batch["position_ids"], width,
            images=(batch["pixel_values"], batch["image_grid_thw"]))
    g = torch.Generator().manual_seed(seed)
    batch["old_logprobs"] = old + 0.05 * torch.randn(old.shape, generator=g)
    batch["advantages"] = torch.randn(4, 1, generator=g).expand(4, width).clone()
    return model, batch


def _fsdp_vl_rank(rank: int, out: str) -> None:
    import torch.distributed as dist

    from rl_core.device import device_mesh
    from rl_core.engines.fsdp import FSDP2Engine
    from tests.unit.test_train_engine import ppo_loss_fn

    model, batch = vl_batch(seed=4)
    engine = FSDP2Engine(model, mesh=device_mesh(torch.device("cpu"), dist.get_world_size()),
                         lr=1e-6, micro_batch_size=1, remove_padding=True)
    grads: dict[str, torch.Tensor] = {}
    engine.inner.optimizer.register_step_pre_hook(lambda *_: grads.update(
        {n: p.grad.full_tensor() for n, p in engine.model.named_parameters()}))
    rows = slice(2 * rank, 2 * rank + 2)
    metrics = engine.train_step({k: v[rows] for k, v in batch.items()}, ppo_loss_fn())
    if rank == 0:
        torch.save({"metrics": metrics, "grads": grads}, out)


def test_two_sharded_ranks_train_a_vision_language_model_as_one_plain_rank(tmp_path):
    """FSDP2 over two ranks, each with two of the rows and their pictures (packed): the vision
    tower is sharded with the rest; the step's metrics and gradients equal one plain rank's on
    all four rows."""
    from rl_core.engines.train import TrainEngine
    from tests.unit.test_train_engine import ppo_loss_fn

    out = tmp_path / "vl.pt"
    spawn(_fsdp_vl_rank, 2, tmp_path, str(out))
    sharded = torch.load(out, weights_only=False)
    model, batch = vl_batch(seed=4)
    plain = TrainEngine(model, lr=1e-6, micro_batch_size=1)
    grads = {}
    plain.optimizer.register_step_pre_hook(lambda *_: grads.update(
        {n: p.grad.clone() for n, p in plain.model.named_parameters()}))
    want = plain.train_step(batch, ppo_loss_fn())
    assert want["actor/grad_norm"] > 0
    assert sharded["metrics"] == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert sorted(sharded["grads"]) == sorted(grads)
    assert any(name.startswith("model.visual.") for name in grads)
    for name, value in grads.items():
        assert torch.allclose(sharded["grads"][name], value, rtol=1e-4, atol=1e-7), name


# --------------------------------------------------------------------------- counting task


def test_each_counting_picture_holds_as_many_squares_as_its_answer(tmp_path):
    train, val = write_squares(tmp_path, num_train=24, num_val=6, seed=3)
    records = load_prompts(train, image_key="images") + load_prompts(val, image_key="images")
    assert len(records) == 30 and all(r.prompt == QUESTION for r in records)
    answers = {int(r.ground_truth) for r in records}
    assert answers <= set(range(GRID * GRID + 1)) and len(answers) > 2
    for record, [image] in zip(records, load_images(records, "training")):
        pixels = np.asarray(image)
        cells = [pixels[r * CELL:(r + 1) * CELL, c * CELL:(c + 1) * CELL].any()
                 for r in range(GRID) for c in range(GRID)]
        assert sum(cells) == int(record.ground_truth), record.where
    again, _ = write_squares(tmp_path / "again", num_train=24, num_val=6, seed=3)
    assert again.read_text() == train.read_text()
    first = json.loads(train.read_text().splitlines()[0])["images"][0]
    assert (tmp_path / first).read_bytes() == (tmp_path / "again" / first).read_bytes()
