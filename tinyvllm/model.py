"""The model: a Hugging Face folder's config.json and safetensors read into one decoder (Llama, Mistral, Qwen2/3, Qwen3-MoE, Mixtral),
its matmuls through gemm.py. model_runner calls it on the step's flattened tokens with an attention function; it knows nothing of
requests, paging or sampling."""
import functools, json, math, os, re, numpy as np, tinygrad.helpers, tinygrad.nn.state
from tinygrad import Tensor, Device, dtypes
from tinyvllm import config, gemm

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM")

def read_config(model_dir:str) -> dict:
  """config.json's keys as Hugging Face wrote them, and these, which the engine reads as if they were (derived here, once):
  head_dim, num_key_value_heads, rope_theta   HF's own keys, filled in where a config leaves them out (transformers' defaults)
  rope                                        rope_scaling or rope_parameters (transformers 5), {} without either
  qkv_bias, qk_norm                           the architecture's q/k/v projection biases (Qwen2), its q/k norms (Qwen3)
  moe_layers, moe_names, num_experts          the sparse layers, the experts' tensor names (Mixtral's or Qwen's), E (0: dense)
  norm_topk_prob                              whether the top-k router weights are renormalized (always for Mixtral)"""
  if not os.path.isfile(path := os.path.join(model_dir, "config.json")): raise FileNotFoundError(f"no model at {model_dir!r}: {path} not found")
  raw = json.load(open(path))
  if (arch := (raw.get("architectures") or ["?"])[0]) not in ARCHITECTURES:
    raise ValueError(f"unsupported architecture {arch!r} in {path}; tinyvllm runs {', '.join(ARCHITECTURES)}")
  # transformers 5 moved rope_theta into rope_parameters
  rope = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
  E, mixtral, step = raw.get("num_experts") or raw.get("num_local_experts") or 0, arch == "MixtralForCausalLM", raw.get("decoder_sparse_step", 1)
  return raw | {"head_dim": raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"], "rope": rope,
                "num_key_value_heads": raw.get("num_key_value_heads") or raw["num_attention_heads"],
                "rope_theta": raw.get("rope_theta") or rope.get("rope_theta", 10000.0),
                "qkv_bias": arch == "Qwen2ForCausalLM" or raw.get("attention_bias", False), "qk_norm": arch.startswith("Qwen3"),
                # mixture of experts: the sparse layers (Qwen3-MoE may keep dense ones among them), the experts' tensor names, top-k renorm
                "moe_layers": [i for i in range(raw["num_hidden_layers"]) if E and (i+1) % step == 0 and i not in raw.get("mlp_only_layers", [])],
                "moe_names": ("block_sparse_moe", "w1", "w3", "w2") if mixtral else ("mlp", "gate_proj", "up_proj", "down_proj"),
                "num_experts": E, "norm_topk_prob": mixtral or raw.get("norm_topk_prob", False)}

def weight_shapes(hf_config:dict) -> dict[str, tuple[int, ...]]:
  """Every tensor the decoder needs, by Hugging Face name: used to check a checkpoint and to build dummy weights."""
  D, hd, H, KV, I = (hf_config[k] for k in ("hidden_size", "head_dim", "num_attention_heads", "num_key_value_heads", "intermediate_size"))
  s = {"model.embed_tokens.weight": (hf_config["vocab_size"], D), "model.norm.weight": (D,)}
  if not hf_config.get("tie_word_embeddings", False): s["lm_head.weight"] = (hf_config["vocab_size"], D)
  for i in range(hf_config["num_hidden_layers"]):
    p = f"model.layers.{i}."
    s |= {p+"input_layernorm.weight": (D,), p+"post_attention_layernorm.weight": (D,), p+"self_attn.o_proj.weight": (D, H*hd),
          p+"self_attn.q_proj.weight": (H*hd, D), p+"self_attn.k_proj.weight": (KV*hd, D), p+"self_attn.v_proj.weight": (KV*hd, D)}
    # the router, and E experts of width moe_intermediate_size (Mixtral's: intermediate_size)
    if i in hf_config["moe_layers"]:
      (moe, *names), E, Ie = hf_config["moe_names"], hf_config["num_experts"], hf_config.get("moe_intermediate_size", I)
      s |= {p+moe+".gate.weight": (E, D)} | {f"{p}{moe}.experts.{e}.{n}.weight": sh for e in range(E) for n, sh in zip(names, [(Ie, D)]*2+[(D, Ie)])}
    else: s |= {p+"mlp.gate_proj.weight": (I, D), p+"mlp.up_proj.weight": (I, D), p+"mlp.down_proj.weight": (D, I)}
    if hf_config["qkv_bias"]: s |= {p+"self_attn.q_proj.bias": (H*hd,), p+"self_attn.k_proj.bias": (KV*hd,), p+"self_attn.v_proj.bias": (KV*hd,)}
    if hf_config["qk_norm"]: s |= {p+"self_attn.q_norm.weight": (hd,), p+"self_attn.k_norm.weight": (hd,)}
  return s

def load_weights(model_dir:str, hf_config:dict, dtype, dummy=False, devices:tuple[str, ...]=(None,)) -> dict[str, Tensor]:
  """The decoder's weights on the device in `dtype`, fused as the model reads them. vLLM's QKVParallelLinear / MergedColumnParallelLinear:
  projections of the same input are one matrix (fewer launches, and a single reduce is what tinygrad's tensor-core path matches: gate and
  up fused by the scheduler into one two-reduce kernel never used them). A layer's experts are stacked into one (E*rows, cols) matrix per
  projection, which the expert matmuls index by expert. Dummy weights are drawn at the fused shapes: drawing and stacking Qwen3-30B-A3B's
  18k expert tensors one by one took minutes.
  Tensor parallel (Megatron, vLLM's ColumnParallelLinear / RowParallelLinear), over `devices`: the fused q/k/v and gate/up are split by
  output rows, each device holding its own rows of every part; o_proj and down_proj by input columns (each device's product is a partial
  sum, all-reduced in gemm.matmul); the rest is copied to every device. A weight is split as it loads, one tensor at a time."""
  shapes, (moe, gate, up, down) = weight_shapes(hf_config), hf_config["moe_names"]
  # each of our tensors: the checkpoint's stacked into it, in weight_shapes' order (q k v; gate up; every expert's gate and up, or down)
  fuse = {r"self_attn\.[qkv]_proj\.": "self_attn.qkv_proj.", r"mlp\.(gate|up)_proj\.": "mlp.gate_up_proj.",
          rf"{moe}\.experts\.\d+\.({gate}|{up})\.": "experts.gate_up.", rf"{moe}\.experts\.\d+\.{down}\.": "experts.down."}
  parts: dict[str, list[str]] = {}
  for k in shapes: parts.setdefault(functools.reduce(lambda name, rule: re.sub(*rule, name), fuse.items(), k), []).append(k)
  tp, axis = len(devices), lambda k: 0 if "qkv_proj" in k or "gate_up_proj" in k else 1 if "o_proj" in k or "down_proj" in k else None
  def place(k:str, t:Tensor) -> Tensor:
    t = (t.shard(devices, axis(k)) if tp > 1 else t).realize()
    # tinygrad stages each copy from disk through a pinned host buffer of its size, freed only at a synchronize: without one the whole
    # checkpoint ends up pinned, with one the next weights of that size reuse the buffer (8B: 10-11 s -> 4.5-4.8 s; BENCHMARKS.md)
    Device[Device.DEFAULT].synchronize()
    return t
  draw = lambda names: Tensor.uniform(sum(shapes[n][0] for n in names), *shapes[names[0]][1:], low=-0.05, high=0.05, dtype=dtype)
  if dummy: return {k: place(k, draw(names)) for k, names in tinygrad.helpers.tqdm(parts.items(), desc="dummy weights")}
  # the checkpoint's tensors kept as UOps, each made a Tensor as it is read: every realize walks every live Tensor (tinygrad internals),
  # and thousands of them slowed each weight's (a Qwen3-MoE-shaped checkpoint of 18,867 tensors, CPU: 249 -> 167 s; BENCHMARKS.md)
  disk = {k: t.uop for f in config.weight_files(model_dir) for k, t in tinygrad.nn.state.safe_load(f"{model_dir}/{f}").items()}
  if missing := [k for k in shapes if k not in disk]: raise KeyError(f"checkpoint in {model_dir} is missing tensor(s): {', '.join(missing[:5])}")
  # numpy reads each tensor where it lies (tinygrad internals: a DISK buffer's memoryview; bf16, which numpy lacks, as its 16-bit words):
  # fewer kernels and realizes than tinygrad's copies from DISK (BENCHMARKS.md). A tensor in the model's dtype goes to the device as it
  # is; bf16 bound for another dtype is widened here by a shift, so compilers without __bf16 (clang 14) never see it
  host = lambda u: np.frombuffer(u.buffer.ensure_allocated().as_memoryview(allow_zero_copy=True), u.dtype.fmt or "u2").reshape(u.shape)
  widen = lambda a: np.left_shift(a, 16, dtype=np.uint32).view(np.float32) if a.dtype == np.uint16 else a
  piece = lambda n: Tensor(host(disk[n])).bitcast(dtype) if disk[n].dtype == dtype else Tensor(widen(host(disk[n]))).cast(dtype)
  # a lone tensor is not concatenated: a cat of one is a copy kernel of its own. Split by rows, device d's rows of every part lie together
  load = lambda names: Tensor.cat(*[piece(n).chunk(tp)[d] for d in range(tp) for n in names]) if len(names) > 1 else piece(names[0])
  return {k: place(k, load(names)) for k, names in tinygrad.helpers.tqdm(parts.items(), desc="loading weights")}

class Transformer:
  """One decoder for Llama 2/3, Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm) and the mixture-of-experts Qwen3-MoE and Mixtral (sparse
  feed-forward layers, see experts). Attention is passed in, so the model knows nothing of paging."""
  def __init__(self, hf_config:dict, weights:dict[str, Tensor], max_len:int, devices:tuple[str, ...]=(None,)):
    self.hf_config, self.w, self.tp = hf_config, weights, len(devices)
    # the rope tables, copied to every device
    hd, r = hf_config["head_dim"], hf_config["rope"]; inv = [hf_config["rope_theta"] ** (-2*i/hd) for i in range(hd//2)]
    if r.get("rope_type", r.get("type")) == "llama3":
      # Llama 3.1 rescales by wavelength: frequencies whose wavelength is short against the original context are kept, long ones are slowed
      # by `factor`, and the band between blends the two (the blend b clamped to [0, 1] gives all three cases)
      orig, low, high = r["original_max_position_embeddings"], r["low_freq_factor"], r["high_freq_factor"]
      inv = [(1 - (b := min(max((orig * f / (2*math.pi) - low) / (high - low), 0), 1))) * f / r["factor"] + b * f for f in inv]
    ang = Tensor.arange(max_len).float().reshape(-1, 1) * Tensor(inv).reshape(1, -1)
    self.cos, self.sin = (table.contiguous().realize().to(devices) for table in (ang.cos(), ang.sin()))
    # tied embeddings share the matrix
    self.lm_head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
    # the embedding's gather is a reduce in the model's dtype, split in two over the vocabulary at decode. Where the renderer emulates that
    # dtype (OpenCL without cl_khr_fp16, Python 3.11's PYTHON device), tinygrad 0.14 fails to build such a reduce (BENCHMARKS.md), so the
    # gather runs in float there: the smaller of the two the renderer has
    supported = Device[devices[0]].renderer.supported_dtypes()
    self.embed = weights["model.embed_tokens.weight"].cast(min({self.lm_head.dtype, dtypes.float} & supported))

  def norm(self, x:Tensor, weight:Tensor) -> Tensor:
    xf = x.float(); return (xf * (xf.square().mean(-1, keepdim=True) + self.hf_config["rms_norm_eps"]).rsqrt()).cast(x.dtype) * weight

  def linear(self, x:Tensor, name:str) -> Tensor:
    y = gemm.matmul(x, self.w[name+".weight"]); return y if (b := self.w.get(name+".bias")) is None else y + b

  def __call__(self, tokens:Tensor, positions:Tensor, attention, rows:Tensor) -> Tensor:
    """tokens, positions: (N,) flattened over the step's sequences; attention(layer, qkv (N, H+2*KV, hd)) -> (N, H, hd). Returns the float
    logits (R, vocab) of the R tokens at `rows` (only the rows that sample need the LM head)."""
    hf_config, N, tp = self.hf_config, tokens.shape[0], self.tp
    hd, H, KV = (hf_config[k] for k in ("head_dim", "num_attention_heads", "num_key_value_heads"))
    cos, sin = self.cos[positions].reshape(N, 1, 1, -1), self.sin[positions].reshape(N, 1, 1, -1); x = self.embed[tokens].cast(self.lm_head.dtype)
    for i in range(hf_config["num_hidden_layers"]):
      p = f"model.layers.{i}."; h = self.norm(x, self.w[p+"input_layernorm.weight"])
      # (N, tp, (H+2*KV)/tp, hd): each device's q, k and v heads (tensor parallel; tp = 1 on one device)
      qkv = self.linear(h, p+"self_attn.qkv_proj").reshape(N, tp, -1, hd)
      # q and k (normed together, each head by its own weight) are roped and put back beside v in one kernel, which the attention kernels
      # read at their heads' offsets: no copy of q, k or v of their own (5 kernels a layer were 3 for Qwen3, 3 were 1 for Llama)
      qk = qkv[:, :, :(H+KV)//tp]
      if hf_config["qk_norm"]:
        qk = self.norm(qk, self.w[p+"self_attn.q_norm.weight"].expand(H//tp, hd).cat(self.w[p+"self_attn.k_norm.weight"].expand(KV//tp, hd)))
      # roped in Hugging Face's rotate_half layout: (N, H+2*KV, hd)
      x1, x2 = qk.chunk(2, -1)
      qkv = (x1*cos - x2*sin).cat(x2*cos + x1*sin, dim=-1).cast(qk.dtype).cat(qkv[:, :, (H+KV)//tp:], dim=2).reshape(N, -1, hd)
      x = x + self.linear(attention(i, qkv).reshape(N, -1), p+"self_attn.o_proj")
      h = self.norm(x, self.w[p+"post_attention_layernorm.weight"])
      if i in hf_config["moe_layers"]: x = x + self.experts(h, p); continue
      # each device's gate and up columns
      gate, up = (t.reshape(N, -1) for t in self.linear(h, p+"mlp.gate_up_proj").reshape(N, tp, 2, -1).split(1, dim=2))
      # contiguous: fused into the down matmul's loads, silu(gate)*up was recomputed for every output tile (measured 2x slower on an H200)
      x = x + self.linear((gate.silu() * up).contiguous(), p+"mlp.down_proj")
    return gemm.matmul(self.norm(x, self.w["model.norm.weight"])[rows], self.lm_head).float()

  def experts(self, x:Tensor, p:str, tile_rows:int=64) -> Tensor:
    """The sparse MoE block, exact (every token keeps its k experts; no capacity drops). Decode-sized steps (under 4 rows per expert on
    average where the tiles run on Hopper's wgmma, 32 elsewhere) run a row per (token, expert) assignment through gemm's GEMV, each row
    reading only its expert's rows of the stacked weights; a step's rows of one expert meet in L2, as a block of W's rows is read by all of
    them at once. Larger steps are vLLM's fused_moe: the N*k assignments sorted by expert (a counting sort) into tiles of tile_rows rows
    (64: a tile of gemm's wgmma kernel on Hopper), each tile padded and owned by one expert, so a chosen expert's weights are read once per
    tile of its tokens, not once per token. Which is faster where: BENCHMARKS.md."""
    c, (N, D), arange = self.hf_config, x.shape, Tensor.arange
    E, k, A, i = c["num_experts"], c["num_experts_per_tok"], N * c["num_experts_per_tok"], arange(c["num_experts"])
    # router: softmax over all E logits in float32, then the top k (rank = how many experts beat one; ties go to the lower id, as torch.topk's)
    probs = self.linear(x, p + c["moe_names"][0] + ".gate").float().softmax(-1)
    rank = ((probs.unsqueeze(-2) > probs.unsqueeze(-1)) | ((probs.unsqueeze(-2) == probs.unsqueeze(-1)) & (i < i.unsqueeze(-1)))).sum(-1)
    # (N, k): the router weights of each token's k experts (sel: their ids)
    weights = probs.gather(-1, sel := (rank.unsqueeze(1) == arange(k).unsqueeze(-1)).where(i, 0).sum(-1))
    if c["norm_topk_prob"]: weights = weights / weights.sum(-1, keepdim=True)
    # inputs: x's row of each output row; owner: the expert of each row (decode), or of each tile's rows; row_of: tiles only, below
    # the tiles pay from ~4 rows per expert on average on wgmma (Hopper, bf16), from ~32 on tinygrad's matmul (BENCHMARKS.md)
    if A < (4 if gemm.hopper(x.device) and x.dtype == dtypes.bfloat16 else 32) * E: inputs, owner, row_of = x, sel.flatten(), None
    else:
      # counted per token, not per assignment: a token picks an expert at most once, so each scan below covers N rows, not N*k
      # (N, E) 0/1; tiles: each expert's whole ones and at most one partial
      chosen, tiles = (sel.unsqueeze(-1) == i).sum(1), A // tile_rows + min(E, A)
      # each expert's rows end where its padded tiles do
      ends = (padded := (chosen.sum(0) + tile_rows - 1) // tile_rows * tile_rows).cumsum()
      # (N, E): the row of token n's assignment to expert e, the expert's tokens in order
      row_of = ends - padded + chosen.cumsum(0) - 1
      # a tile's expert: how many experts' rows end by its first row, E for a padding tile past the last expert's rows
      expert = (ends <= arange(tiles).unsqueeze(1) * tile_rows).sum(1)
      # (tiles, tile_rows): E becomes -1, the others stay, as (expert + 1) % (E + 1) - 1 maps them. The wgmma kernel skips a tile of -1;
      # tinygrad's indexing reads it as expert E-1
      owner = ((expert + 1) % (E + 1) - 1).unsqueeze(1).expand(tiles, tile_rows)
      # each row's token: how many of its expert's tokens have rows before it (a padding row counts them all: N, which reads zeros)
      # (tiles*tile_rows, D)
      inputs = x[(row_of.T[owner.flatten()] < arange(tiles * tile_rows).unsqueeze(1)).sum(1)]
    # the layer's experts' weights, stacked: (E, rows, cols)
    gate, up = gemm.matmul(inputs, self.w[p + "experts.gate_up.weight"].reshape(E, -1, D), experts=owner).chunk(2, -1)
    # (A or tiles*tile_rows, D)
    y = gemm.matmul((gate.silu() * up).contiguous(), self.w[p + "experts.down.weight"].reshape(E, D, -1), experts=owner)
    return ((y if row_of is None else y[row_of.gather(-1, sel)]).reshape(N, k, D) * weights.cast(y.dtype).unsqueeze(-1)).sum(1)
