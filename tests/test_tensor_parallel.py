"""Tensor parallelism (Megatron) on two virtual CPU devices, so CI checks it without a GPU: the same tokens as one device, and as
transformers on the same safetensors; a size that cannot split the model is a clear error."""
import json, re, shutil, pytest, torch, transformers
from tinyvllm import LLM, SamplingParams
from tinyvllm.config import BUNDLED_MODEL
from test_model import TINY, save_random

REF = json.load(open(__file__.rsplit("/", 1)[0] + "/data/reference.json"))["cases"]
PROMPTS = [case["prompt_token_ids"] for case in REF[:3]] + [REF[0]["prompt_token_ids"] * 40]   # the last one is long: a chunked prefill
PARAMS = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=24)]

def tokens(llm:LLM, params:SamplingParams) -> list[list[int]]:
  return [out.outputs[0].token_ids for out in llm.generate(PROMPTS, params, use_tqdm=False)]

@pytest.fixture(scope="module")
def one_device() -> list[list[list[int]]]:
  """The reference: one device's tokens for each of PARAMS, once for both variants below. In graphs: an eager engine of one device
  (~25 s of compiles, 0.3-0.6 s a step on 2 cores) would add nothing, since a split run, eager or not, must give these tokens."""
  one = LLM(device="CPU", max_num_seqs=8, max_num_batched_tokens=512, max_model_len=1024)
  return [tokens(one, params) for params in PARAMS]

@pytest.mark.parametrize("eager", [True, False], ids=["eager", "graphs"])
def test_two_devices_give_one_devices_tokens(eager, one_device):
  """The bundled model split over two devices (4 of its 8 heads and 2 of its 4 KV heads each, half of every MLP) samples what one device
  samples: greedy and seeded top-p, a prefill long enough for the dense in-step attention (512 tokens a step) included."""
  two = LLM(device="CPU", tensor_parallel_size=2, enforce_eager=eager, max_num_seqs=8, max_num_batched_tokens=512, max_model_len=1024)
  assert two.engine.runner.kv[0][0].device == ("CPU", "CPU:1") and two.engine.runner.kv[0][0].uop.axis == 1   # split by KV head
  assert [tokens(two, params) for params in PARAMS] == one_device

def test_qwen2_shape_at_two_devices_is_greedy_equal_to_transformers(tmp_path):
  """qkv bias, an untied LM head and grouped KV heads (4 heads, 2 KV heads): each device holds its own rows of every fused part."""
  cfg = transformers.Qwen2Config(**(TINY | dict(vocab_size=512)), tie_word_embeddings=False, architectures=["Qwen2ForCausalLM"])
  path = save_random(cfg, tmp_path)
  for name in ("tokenizer.json", "tokenizer_config.json"): shutil.copy(f"{BUNDLED_MODEL}/{name}", tmp_path)
  model, prompt = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), REF[1]["prompt_token_ids"]
  with torch.no_grad():   # greedy decoding by hand: every step's argmax of transformers' logits
    ids = list(prompt)
    for _ in range(16): ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
  llm = LLM(path, device="CPU", tensor_parallel_size=2, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256)
  assert llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)[0].outputs[0].token_ids == ids[len(prompt):]

def test_sizes_that_cannot_split_the_model_are_refused(tmp_path):
  with pytest.raises(ValueError, match=re.escape("tensor_parallel_size 3 must divide the model's {'num_attention_heads': 8, 'num_key_value_heads': 4")):
    LLM(device="CPU", tensor_parallel_size=3)
  for name in ("tokenizer.json", "tokenizer_config.json"): shutil.copy(f"{BUNDLED_MODEL}/{name}", tmp_path)
  # an MLP width two devices cannot halve (heads that they can): refused before any weight loads
  (tmp_path / "config.json").write_text(transformers.LlamaConfig(**(TINY | dict(intermediate_size=33)), architectures=["LlamaForCausalLM"]).to_json_string())
  with pytest.raises(ValueError, match=re.escape("tensor_parallel_size 2 must divide the model's {'num_attention_heads': 4, 'num_key_value_heads': 2, "
                                                 "'intermediate_size': 33}")):
    LLM(str(tmp_path), device="CPU", tensor_parallel_size=2, load_format="dummy")
  with pytest.raises(ValueError, match="tensor_parallel_size must be positive"): LLM(device="CPU", tensor_parallel_size=0)
  cfg = transformers.Qwen3MoeConfig(**TINY, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, architectures=["Qwen3MoeForCausalLM"])
  (tmp_path / "config.json").write_text(cfg.to_json_string())
  with pytest.raises(ValueError, match="mixture-of-experts models run with tensor_parallel_size 1"):
    LLM(str(tmp_path), device="CPU", tensor_parallel_size=2, load_format="dummy")
