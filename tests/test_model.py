"""The decoder against Hugging Face transformers on the same safetensors (fp32, CPU)."""
import json, os, pytest, numpy as np, torch, transformers
from tinygrad import Tensor, dtypes
from tinyvllm.config import BUNDLED_MODEL, model_path
from tinyvllm.model import read_config, load_weights, Transformer

def causal(c:dict):   # plain contiguous attention: the model is checked on its own, the paged cache elsewhere
  def attention(i, qkv):
    q, k, v = (t.transpose(0, 1) for t in qkv.split([c["num_attention_heads"]] + [c["num_key_value_heads"]]*2, dim=1))
    return q.scaled_dot_product_attention(k, v, is_causal=True, enable_gqa=True).transpose(0, 1)
  return attention

def our_logits(model_dir, ids):
  c = read_config(model_dir)
  m = Transformer(c, load_weights(model_dir, c, dtypes.float32), 64)
  return m(Tensor(ids), Tensor.arange(len(ids)), causal(c), Tensor.arange(len(ids))).numpy()

def hf_logits(model_dir, ids):
  with torch.no_grad():
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)(torch.tensor([ids])).logits[0].numpy()

def test_stories260k_matches_recorded_and_live_transformers():
  case = json.load(open(os.path.join(os.path.dirname(__file__), "data", "reference.json")))["cases"][0]
  ours = our_logits(BUNDLED_MODEL, case["prompt_token_ids"])
  np.testing.assert_allclose(ours[-1], case["first_position_logits"], atol=1e-4)
  np.testing.assert_allclose(ours, hf_logits(BUNDLED_MODEL, case["prompt_token_ids"]), atol=1e-4)

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=256)
CONFIGS = {
  "llama3": lambda: transformers.LlamaConfig(**TINY, rope_theta=500000.0, tie_word_embeddings=False, rope_scaling={
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
  "llama-tied": lambda: transformers.LlamaConfig(**TINY, tie_word_embeddings=True),
  "qwen2": lambda: transformers.Qwen2Config(**TINY, tie_word_embeddings=True),
  "qwen3": lambda: transformers.Qwen3Config(**TINY, head_dim=32, tie_word_embeddings=False),
  # wider projections (256 / 512), qkv bias included
  "qwen2-split-k": lambda: transformers.Qwen2Config(**(TINY | dict(hidden_size=256, intermediate_size=512)), tie_word_embeddings=True),
}

def save_random(cfg, path, dtype=torch.float32, **kw):
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(cfg).to(dtype)
  with torch.no_grad():   # transformers initialises norms to 1 and biases to 0: randomise them so those code paths are really checked
    for n, p in model.named_parameters():
      if n.endswith("bias") or "norm" in n: p.add_(torch.randn_like(p) * 0.1)
  model.save_pretrained(path, **kw)
  return str(path)

@pytest.mark.parametrize("name", CONFIGS)
def test_random_tiny_configs_match_transformers(name, tmp_path):
  path = save_random(CONFIGS[name](), tmp_path)
  ids = np.random.default_rng(1).integers(0, 128, 40).tolist()
  np.testing.assert_allclose(our_logits(path, ids), hf_logits(path, ids), atol=1e-4)

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_and_sharded_checkpoints(dtype, tmp_path):
  path = save_random(CONFIGS["llama3"](), tmp_path, dtype, max_shard_size="30KB")
  assert os.path.exists(os.path.join(path, "model.safetensors.index.json"))
  ids = list(range(3, 40))
  np.testing.assert_allclose(our_logits(path, ids), hf_logits(path, ids), atol=1e-4)   # HF upcasts the same 16-bit weights to fp32

@pytest.mark.parametrize("shard", [None, "30KB"], ids=["one-file", "sharded"])
def test_hub_download_fetches_only_the_weights_it_reads(shard, tmp_path, monkeypatch):
  """A hub id (issue #70): its json files first, then only the weight files the index names (or the one model.safetensors), not a
  consolidated.safetensors beside them (Mistral-7B-Instruct-v0.3's, 14.5 GB). The hub is a local repo folder here, each snapshot_download
  fetching what huggingface_hub's own pattern filter picks from it; the download then loads and matches transformers."""
  import huggingface_hub, shutil
  repo = save_random(CONFIGS["llama3"](), tmp_path / "repo", **({"max_shard_size": shard} if shard else {}))
  weights = {f for f in os.listdir(repo) if f.endswith(".safetensors")}
  shutil.copy(os.path.join(repo, min(weights)), os.path.join(repo, "consolidated.safetensors"))
  def snapshot_download(repo_id, allow_patterns):   # into one snapshot folder, as the hub's cache does
    os.makedirs(snapshot := str(tmp_path / "snapshot"), exist_ok=True)
    for f in huggingface_hub.utils.filter_repo_objects(os.listdir(repo), allow_patterns=allow_patterns): shutil.copy(os.path.join(repo, f), snapshot)
    return snapshot
  monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
  path = model_path("mistralai/tiny-mistral")
  assert {f for f in os.listdir(path) if f.endswith(".safetensors")} == weights and (len(weights) > 1) == bool(shard)
  ids = list(range(3, 40))
  np.testing.assert_allclose(our_logits(path, ids), hf_logits(path, ids), atol=1e-4)

def test_dummy_weights_need_only_config(tmp_path):
  cfg = CONFIGS["qwen3"](); cfg.architectures = ["Qwen3ForCausalLM"]
  (tmp_path / "config.json").write_text(cfg.to_json_string())
  c = read_config(str(tmp_path))
  w = load_weights(str(tmp_path), c, dtypes.float32, dummy=True)
  assert w["model.layers.1.self_attn.q_norm.weight"].shape == (32,) and "lm_head.weight" in w

def test_clear_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="no model at"): read_config(str(tmp_path / "nope"))
  (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
  with pytest.raises(ValueError, match="GPT2LMHeadModel"): read_config(str(tmp_path))
  path = save_random(CONFIGS["qwen2"](), tmp_path / "m")
  from safetensors.torch import load_file, save_file
  sd = load_file(os.path.join(path, "model.safetensors")); del sd["model.layers.1.mlp.up_proj.weight"]
  save_file(sd, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  with pytest.raises(KeyError, match="model.layers.1.mlp.up_proj.weight"): load_weights(path, read_config(path), dtypes.float32)
