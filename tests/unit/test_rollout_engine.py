"""Native rollout engine on tiny models: agreement with transformers' generate and with a full
forward pass, seeds, batch layout, eos and truncation, the KV cache, fallback architectures."""

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from rl_core.models.tiny import build_tiny
from rl_core.rollout import decoder as decoder_module
from rl_core.rollout.decoder import fast_path_reason
from rl_core.rollout.native import NativeRolloutEngine
from rl_core.rollout.sampling import SamplingParams

PAD, EOS = 256, 258
LENGTHS = (1, 3, 5, 8, 11, 16)
# A random tiny model mostly repeats one token; weights scaled up make it change its mind,
# so agreement tests see varied, context-dependent output.
SCALE = 6.0


def scaled(model: torch.nn.Module, scale: float = SCALE) -> torch.nn.Module:
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.mul_(scale)
    return model.eval()


def nano(seed: int = 0) -> torch.nn.Module:
    return scaled(build_tiny("nano", seed)[0])


def make_prompts(lengths=LENGTHS, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in lengths]


def tiny_config_model(cls, config):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return scaled(cls(config))


def llama():
    config = LlamaConfig(
        vocab_size=263, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
        pad_token_id=PAD, eos_token_id=EOS, bos_token_id=None,
    )
    return tiny_config_model(LlamaForCausalLM, config)


def qwen3():
    config = Qwen3Config(
        vocab_size=263, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
        pad_token_id=PAD, eos_token_id=EOS, bos_token_id=None,
    )
    return tiny_config_model(Qwen3ForCausalLM, config)


def gpt2():
    config = GPT2Config(
        vocab_size=263, n_embd=32, n_layer=2, n_head=4, n_positions=128,
        pad_token_id=PAD, eos_token_id=EOS, bos_token_id=EOS,
    )
    return tiny_config_model(GPT2LMHeadModel, config)


@pytest.fixture(scope="module")
def model():
    return nano()


def hf_greedy(model, batch, max_new_tokens, eos_token_ids):
    """transformers' greedy generate on the batch's (left-padded) prompts."""
    ids, mask = batch.prompt_ids, batch.prompt_mask
    out = model.generate(
        ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=eos_token_ids, pad_token_id=PAD,
    )
    return out[:, ids.shape[1] :]


def greedy(engine, prompts, max_new_tokens=16):
    return engine.generate(prompts, SamplingParams(max_new_tokens, do_sample=False))


def stop_tokens(model, prompts) -> list[int]:
    """Eos ids that some rows of the greedy output reach early and others never do."""
    free_run = greedy(NativeRolloutEngine(model, [263], PAD), prompts).response_ids
    return [EOS, int(free_run[0, 4]), int(free_run[-1, 9])]


def assert_same_as_hf(model, prompts, fast, max_new_tokens=16):
    eos = stop_tokens(model, prompts)
    engine = NativeRolloutEngine(model, eos, PAD, fast=fast)
    batch = greedy(engine, prompts, max_new_tokens)
    expected = hf_greedy(model, batch, max_new_tokens, eos)
    width = batch.response_ids.shape[1]
    assert torch.equal(batch.response_ids, expected[:, :width])
    assert (expected[:, width:] == PAD).all()
    assert 0 < int(batch.finished.sum()) < len(prompts)  # some stopped early, some ran out
    return batch


def full_forward_logprobs(model, batch, temperature):
    """Log-probs of the response tokens from one forward pass over the whole sequences."""
    input_ids, attention_mask, position_ids = batch.to_sequences()
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
    ).logits
    width = batch.prompt_ids.shape[1]
    logp = (logits[:, width - 1 : -1].float() / temperature).log_softmax(-1)
    return logp.gather(-1, batch.response_ids[..., None]).squeeze(-1) * batch.response_mask


# --------------------------------------------------------------------------- agreement


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "hf-forward"])
def test_greedy_equals_transformers_generate_token_for_token(model, fast):
    batch = assert_same_as_hf(model, make_prompts(), fast)
    assert batch.response_ids.shape == (len(LENGTHS), 16)


@pytest.mark.parametrize("build", [llama, qwen3], ids=["llama-biases", "qwen3-qk-norm"])
def test_greedy_equals_generate_on_other_llama_style_models(build):
    model = build()
    assert fast_path_reason(model) is None
    assert_same_as_hf(model, make_prompts(), fast=True)


def test_other_architectures_run_through_the_models_own_forward():
    model = gpt2()
    assert "gpt2" in fast_path_reason(model)
    assert_same_as_hf(model, make_prompts(), fast=True)


def test_a_sliding_window_within_reach_sends_the_model_through_its_own_forward():
    config = MistralConfig(
        vocab_size=263, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=24,
    )
    model = tiny_config_model(MistralForCausalLM, config)
    assert fast_path_reason(model, length=24) is None
    assert "sliding attention window (24)" in fast_path_reason(model, length=25)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "hf-forward"])
def test_logprobs_equal_a_full_forward_pass(model, fast, temperature):
    prompts = make_prompts()
    engine = NativeRolloutEngine(model, stop_tokens(model, prompts), PAD, fast=fast)
    params = SamplingParams(24, temperature=temperature, n=2)
    batch = engine.generate(prompts, params, torch.Generator().manual_seed(0))
    expected = full_forward_logprobs(model, batch, temperature)
    assert batch.logprobs.dtype == torch.float32
    assert (batch.logprobs * (1 - batch.response_mask) == 0).all()
    torch.testing.assert_close(batch.logprobs, expected, atol=1e-5, rtol=0)


def test_fast_and_hf_forward_decoders_sample_the_same_tokens(model):
    prompts = make_prompts()
    params = SamplingParams(16, temperature=0.8, top_p=0.95, n=2)
    batches = [
        NativeRolloutEngine(model, [EOS], PAD, fast=fast).generate(
            prompts, params, torch.Generator().manual_seed(3)
        )
        for fast in (True, False)
    ]
    assert torch.equal(batches[0].response_ids, batches[1].response_ids)


# --------------------------------------------------------------------------- sampling


def test_the_same_seed_repeats_and_another_seed_differs(model):
    engine = NativeRolloutEngine(model, [EOS], PAD)
    params = SamplingParams(16, temperature=1.0, n=2)

    def run(seed):
        return engine.generate(make_prompts(), params, torch.Generator().manual_seed(seed))

    first, again, other = run(1), run(1), run(2)
    assert torch.equal(first.response_ids, again.response_ids)
    assert torch.equal(first.logprobs, again.logprobs)
    assert not torch.equal(first.response_ids, other.response_ids)


@pytest.mark.parametrize(
    "filters", [{"top_k": 1}, {"top_p": 1e-6}], ids=["top_k=1", "tiny top_p"]
)
def test_filters_that_keep_one_token_equal_greedy(model, filters):
    engine = NativeRolloutEngine(model, [EOS], PAD)
    prompts = make_prompts()
    sampled = engine.generate(
        prompts, SamplingParams(16, **filters), torch.Generator().manual_seed(0)
    )
    assert torch.equal(sampled.response_ids, greedy(engine, prompts).response_ids)


def test_n_samples_per_prompt_are_adjacent_rows(model):
    engine = NativeRolloutEngine(model, [EOS], PAD)
    prompts = make_prompts((4, 9))
    batch = engine.generate(prompts, SamplingParams(12, n=3), torch.Generator().manual_seed(0))
    assert len(batch) == 6
    assert batch.prompt_index.tolist() == [0, 0, 0, 1, 1, 1]
    for row, index in enumerate(batch.prompt_index.tolist()):
        length = len(prompts[index])
        assert batch.prompt_ids[row, -length:].tolist() == prompts[index]
        assert batch.prompt_mask[row].tolist() == [0] * (9 - length) + [1] * length
    assert not torch.equal(batch.response_ids[0], batch.response_ids[1])


# --------------------------------------------------------------------------- ends


def test_response_mask_covers_the_eos_token_and_nothing_after(model):
    prompts = make_prompts()
    eos = stop_tokens(model, prompts)
    batch = greedy(NativeRolloutEngine(model, eos, PAD), prompts)
    for row in range(len(batch)):
        length = int(batch.response_lengths[row])
        mask = batch.response_mask[row].tolist()
        assert mask == [1] * length + [0] * (len(mask) - length)
        assert (batch.response_ids[row, length:] == PAD).all()
        assert (batch.logprobs[row, length:] == 0).all()
        assert bool(batch.finished[row]) == (int(batch.response_ids[row, length - 1]) in eos)
        assert eos[0] not in batch.response_ids[row, : length - 1].tolist()


def test_max_new_tokens_cuts_responses_and_marks_them_unfinished(model):
    engine = NativeRolloutEngine(model, [263], PAD)  # an id outside the vocabulary
    batch = engine.generate(make_prompts(), SamplingParams(7), torch.Generator().manual_seed(0))
    assert batch.response_ids.shape == (len(LENGTHS), 7)
    assert batch.response_lengths.tolist() == [7] * len(LENGTHS)
    assert not batch.finished.any()
    assert batch.response_mask.all()


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "hf-forward"])
def test_stopped_rows_are_dropped_from_the_batch_without_changing_results(
    model, fast, monkeypatch
):
    kept_rows = []
    decoder = decoder_module.FastDecoder if fast else decoder_module.HFDecoder
    select = decoder.select

    def spy(self, keep, columns):
        kept_rows.append(len(keep))
        return select(self, keep, columns)

    monkeypatch.setattr(decoder, "select", spy)
    assert_same_as_hf(model, make_prompts(), fast)
    assert kept_rows and kept_rows[0] < len(LENGTHS)


def test_all_rows_stopping_ends_generation_early(model):
    prompts = make_prompts()
    free_run = greedy(NativeRolloutEngine(model, [263], PAD), prompts).response_ids
    batch = greedy(NativeRolloutEngine(model, free_run[:, 2].tolist(), PAD), prompts)
    assert batch.finished.all()
    assert batch.response_ids.shape[1] <= 3


def test_to_sequences_gives_the_training_forward_its_inputs(model):
    prompts = make_prompts((2, 5))
    batch = greedy(NativeRolloutEngine(model, [263], PAD), prompts, max_new_tokens=4)
    input_ids, attention_mask, position_ids = batch.to_sequences()
    assert input_ids.shape == attention_mask.shape == position_ids.shape == (2, 9)
    assert torch.equal(input_ids, torch.cat([batch.prompt_ids, batch.response_ids], 1))
    assert attention_mask[0].tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert position_ids[0].tolist()[3:] == [0, 1, 2, 3, 4, 5]
    assert position_ids[1].tolist() == list(range(9))


# --------------------------------------------------------------------------- the engine


def test_free_cache_drops_the_kv_cache_and_generation_still_works(model):
    engine = NativeRolloutEngine(model, [EOS], PAD)
    prompts = make_prompts()
    first = greedy(engine, prompts)
    assert engine.cache_nbytes > 0
    engine.free_cache()
    assert engine.cache_nbytes == 0
    assert torch.equal(greedy(engine, prompts).response_ids, first.response_ids)


def test_each_call_reads_the_current_weights():
    model = nano(seed=1)
    engine = NativeRolloutEngine(model, [EOS], PAD)
    prompts = make_prompts()
    before = greedy(engine, prompts).response_ids
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)  # tied: the embeddings flip too
    after = greedy(engine, prompts)
    assert not torch.equal(after.response_ids, before)
    expected = hf_greedy(model, after, 16, [EOS])
    assert torch.equal(after.response_ids, expected[:, : after.response_ids.shape[1]])


def test_generation_restores_train_mode_and_returns_ordinary_tensors():
    model = nano().train()
    batch = greedy(NativeRolloutEngine(model, [EOS], PAD), make_prompts())
    assert model.training
    for value in batch.columns.values():
        assert not value.is_inference() and not value.requires_grad


def test_without_onednn_packing_the_plain_linear_gives_the_same_tokens(model, monkeypatch):
    monkeypatch.setattr(decoder_module, "_onednn_packing", lambda weight: False)
    assert_same_as_hf(model, make_prompts(), fast=True)


def test_a_bfloat16_rollout_of_float32_weights_stays_close_to_them():
    model = build_tiny("nano", 0)[0]  # unscaled: bfloat16 rounding stays small
    engine = NativeRolloutEngine(model, [EOS], PAD, dtype=torch.bfloat16)
    batch = engine.generate(make_prompts(), SamplingParams(16), torch.Generator().manual_seed(0))
    assert batch.logprobs.dtype == torch.float32
    assert next(model.parameters()).dtype == torch.float32  # the model itself is untouched
    expected = full_forward_logprobs(model, batch, 1.0)
    torch.testing.assert_close(batch.logprobs, expected, atol=2e-2, rtol=0)


def test_a_compute_dtype_needs_the_fast_decoder():
    engine = NativeRolloutEngine(gpt2(), [EOS], PAD, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="gpt2"):
        engine.generate(make_prompts(), SamplingParams(4))


def test_prompts_must_be_given_and_non_empty(model):
    engine = NativeRolloutEngine(model, [EOS], PAD)
    with pytest.raises(ValueError, match="no prompts"):
        engine.generate([], SamplingParams(4))
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[1, 2], []], SamplingParams(4))
    with pytest.raises(ValueError, match="eos_token_ids"):
        NativeRolloutEngine(model, [], PAD)


# --------------------------------------------------------------------------- device graphs


class CountingGraphs(decoder_module.EagerGraphs):
    """Eager stand-in for device graphs that also counts the captures and the replays."""

    def __init__(self):
        self.keys, self.replays = [], 0

    def capture(self, fn):
        graph, out = super().capture(fn)
        outer = self

        class Counted:
            def replay(self):
                outer.replays += 1
                graph.replay()

        self.keys.append(fn.args[0].shape[0])  # the rows the captured step runs
        return Counted(), out


@pytest.fixture
def short_spans(monkeypatch):
    monkeypatch.setattr(decoder_module.StepGraphs, "SPAN", 8)  # several spans in 16 tokens


@pytest.mark.parametrize("make", [nano, llama, qwen3], ids=["nano", "llama", "qwen3"])
def test_graphed_steps_give_the_tokens_and_logprobs_of_plain_steps(make, short_spans):
    """Static buffers, row buckets, spans with the later columns masked, in-place compaction:
    the step a device graph replays samples what the plain step does."""
    model, prompts = make(), make_prompts(LENGTHS * 2)
    eos = stop_tokens(model, prompts)
    params = SamplingParams(max_new_tokens=24, temperature=0.9, n=3)
    plain = NativeRolloutEngine(model, eos, PAD, graphs=False)
    graphs = CountingGraphs()
    graphed = NativeRolloutEngine(model, eos, PAD, graphs=graphs)
    a = plain.generate(prompts, params, torch.Generator().manual_seed(3))
    b = graphed.generate(prompts, params, torch.Generator().manual_seed(3))
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.response_mask, b.response_mask)
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5)
    assert 0 < int(a.finished.sum()) < a.finished.shape[0]  # rows stopped at different steps
    # Captured once per (bucket, span): the buckets only shrink, the batch's 36 rows first.
    assert graphs.keys[0] == 36 and graphs.keys == sorted(graphs.keys, reverse=True)
    assert len(graphs.keys) == graphed.captures >= 3  # 24 + 16 columns: spans 8, 16, ... 48
    assert graphs.replays == b.response_ids.shape[1] - 1


def test_graphed_greedy_equals_transformers_generate(model, short_spans):
    prompts = make_prompts()
    eos = stop_tokens(model, prompts)
    engine = NativeRolloutEngine(model, eos, PAD, graphs=decoder_module.EagerGraphs())
    batch = greedy(engine, prompts, 16)
    expected = hf_greedy(model, batch, 16, eos)
    assert torch.equal(batch.response_ids, expected[:, : batch.response_ids.shape[1]])


def test_graph_buckets_are_powers_of_two_up_to_the_batch():
    steps = decoder_module.StepGraphs.__new__(decoder_module.StepGraphs)
    steps.rows = 48
    assert [steps.bucket(n) for n in (1, 2, 3, 5, 16, 17, 33, 48)] == [1, 2, 4, 8, 16, 32, 48, 48]
    assert steps.compacts(48, 32) and not steps.compacts(48, 40) and not steps.compacts(8, 5)


def test_device_graphs_are_used_where_the_device_has_them(model):
    assert NativeRolloutEngine(model, [EOS], PAD).graphs is None  # a CPU has none
    with pytest.raises(ValueError, match="graphs=True: cpu has no device graphs"):
        NativeRolloutEngine(model, [EOS], PAD, graphs=True)
    assert decoder_module.graph_backend(torch.device("cpu")) is None
