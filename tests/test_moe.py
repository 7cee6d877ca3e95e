"""Mixture-of-experts decoders (Qwen3-MoE, Mixtral) against Hugging Face transformers on random tiny checkpoints in the hub layout (CPU,
fp32): logits, greedy tokens alone and in one batch (routing must not depend on the batch), and through the server."""
import asyncio, shutil, threading, time, pytest, numpy as np, openai, torch, transformers, uvicorn
from tinygrad import Tensor, dtypes
from tinyvllm import LLM, SamplingParams, Config
from tinyvllm.config import BUNDLED_MODEL
from tinyvllm.llm_engine import AsyncLLM
from tinyvllm.model import read_config, load_weights, Transformer
from tinyvllm.serve import build_app
from test_model import causal, hf_logits, save_random
from test_server import free_socket

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=256, initializer_range=0.1)
CONFIGS = {   # 8 experts of width 32, 2 or 3 chosen per token; dense layers (width 96) among the sparse ones in both Qwen3-MoE spellings
  "qwen3-moe-sparse-step": lambda: transformers.Qwen3MoeConfig(**TINY, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                                                               decoder_sparse_step=2, norm_topk_prob=False),
  "qwen3-moe-mlp-only-norm": lambda: transformers.Qwen3MoeConfig(**TINY, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=3,
                                                                 mlp_only_layers=[1], norm_topk_prob=True),
  "mixtral": lambda: transformers.MixtralConfig(**TINY, num_local_experts=8, num_experts_per_tok=2),   # always renormalizes the top k
}

def checkpoint(name, path):
  """A saved random checkpoint (per-expert tensors, as on the hub) with the bundled model's tokenizer beside it."""
  save_random(CONFIGS[name](), path)
  for f in ("tokenizer.json", "tokenizer_config.json"): shutil.copy(f"{BUNDLED_MODEL}/{f}", path)
  return str(path)

@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory): return checkpoint("qwen3-moe-sparse-step", tmp_path_factory.mktemp("qwen3-moe"))

def hf_greedy(path, prompts, n):
  hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  return [hf.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False, eos_token_id=None)[0, len(p):].tolist() for p in prompts]

PROMPTS = [np.random.default_rng(n).integers(3, 512, n).tolist() for n in (1, 5, 17, 40)]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

@pytest.mark.parametrize("name", CONFIGS)
def test_logits_match_transformers(name, tmp_path):
  path = checkpoint(name, tmp_path)
  c = read_config(path)
  assert c["moe_layers"] == {"qwen3-moe-sparse-step": [1], "qwen3-moe-mlp-only-norm": [0, 2], "mixtral": [0, 1, 2]}[name]
  m = Transformer(c, load_weights(path, c, dtypes.float32), 256)
  # steps of under 32 rows per expert (N * k < 32 * 8 assignments) take gemm's GEMV with an expert per row: 1-3 tokens, and the last step
  # size before the path changes; from there, assignments sorted into tiles of 64 rows (T) per expert
  last = -(-32 * 8 // c["num_experts_per_tok"]) - 1
  for n in (1, 2, 3, last, last + 1):
    ids = np.random.default_rng(n).integers(0, 512, n).tolist()
    ours = m(Tensor(ids), Tensor.arange(n), causal(c), Tensor.arange(n)).numpy()
    np.testing.assert_allclose(ours, hf_logits(path, ids), atol=1e-4, err_msg=f"{n} tokens")

def test_greedy_alone_and_batched_match_transformers(qwen3_moe):
  # step buckets of 1-8 tokens, each a row per (token, expert) through the GEMV; prompts past 8 tokens are chunked
  llm = LLM(qwen3_moe, "CPU", max_num_seqs=4, max_num_batched_tokens=8)
  ref = hf_greedy(qwen3_moe, PROMPTS, 8)
  assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == ref
  assert [llm.generate([p], GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in PROMPTS] == ref
  assert len({tuple(r) for r in ref}) == len(ref)   # the prompts really lead to different continuations

def test_server_matches_transformers(qwen3_moe):
  llm = AsyncLLM(Config(qwen3_moe, "CPU", max_num_seqs=4, max_num_batched_tokens=8))   # the same shapes: its graphs come from the caches
  while llm.engine.runner.pending: time.sleep(0.05)   # every graph in (captured while idle): no capture shares tinygrad with later tests
  sock, loop = free_socket(), asyncio.new_event_loop()
  server = uvicorn.Server(uvicorn.Config(build_app(llm, "qwen3-moe"), log_level="warning"))
  th = threading.Thread(target=lambda: loop.run_until_complete(server.serve(sockets=[sock])), daemon=True); th.start()
  try:
    while not server.started: assert th.is_alive(), "server did not start"; time.sleep(0.05)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}/v1", api_key="x", timeout=60, max_retries=0)
    messages = [{"role": "user", "content": "Once upon a time, there was a little girl named Lily."}]
    resp = client.chat.completions.create(model="qwen3-moe", messages=messages, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    tok = llm.engine.tokenizer
    assert resp.choices[0].message.content == tok.hf.decode(hf_greedy(qwen3_moe, [tok.encode_chat(messages)], 8)[0])
  finally: server.should_exit = True; th.join(15); sock.close()

def test_dummy_weights_build_an_moe_model(tmp_path):
  cfg = CONFIGS["qwen3-moe-mlp-only-norm"](); cfg.architectures = ["Qwen3MoeForCausalLM"]
  (tmp_path / "config.json").write_text(cfg.to_json_string())
  c = read_config(str(tmp_path))
  m = Transformer(c, load_weights(str(tmp_path), c, dtypes.float32, dummy=True), 64)
  assert m.w["model.layers.0.experts.gate_up.weight"].shape == (8 * 2 * 32, 64) and m.w["model.layers.1.mlp.gate_up_proj.weight"].shape == (192, 64)
