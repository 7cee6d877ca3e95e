"""The runner, the device side of a step: llm_engine hands it the scheduler's batch, it packs the batch into one step buffer and
launches the model (model.py, attention.py over the KV pool it owns) and the sampler (sampler.py) as captured TinyJit graphs, and
reads the sampled tokens back once the step has run. Everything on the device goes through it; it also keeps tinygrad's compile caches
across start-ups and decides when each graph is captured (capture_next). llm_engine alone calls it."""
import ctypes, functools, itertools, lzma, os, sqlite3, time, numpy as np, llguidance, llguidance.numpy, tinygrad.codegen, tinygrad.schedule
from tinygrad import Tensor, TinyJit, Device, Context, UOp, dtypes
from tinygrad.helpers import diskcache_get, diskcache_put, db_connection, CACHELEVEL, CACHEDB
# tinygrad internals: its CUDA bindings
import tinygrad.runtime.autogen.cuda as cuda
from tinyvllm.config import Config, log
from tinyvllm import attention, gemm, model, sampler, sequence

# A step's inputs travel to the device as one int32 buffer (one copy per step): the block-table rows of the step's R sampled rows, rows of
# R per-sample values (temperatures, top_p and min_p as float32 bits), then rows of N per-token values. A sequence samples one row:
# R = min(N, max_num_seqs). What the sampler reads comes first, so it lies where it lies for every token count N of that R: one sampler
# graph serves them all.
TOKEN_ROWS = ("tokens", "positions", "slots", "token_seq", "cached_lens")
SAMPLE_ROWS = ("logits_idx", "seeds", "out_positions", "top_k", "temperatures", "top_p", "min_p")

def step_layout(num_tokens:int, num_rows:int, max_blocks:int) -> dict[str, slice]:
  """Where each input lives in the step buffer: the one layout both the packing (host) and the unpacking (graph) read."""
  sizes = {"block_tables": num_rows * max_blocks, **dict.fromkeys(SAMPLE_ROWS, num_rows), **dict.fromkeys(TOKEN_ROWS, num_tokens)}
  return {name: slice(end - size, end) for (name, size), end in zip(sizes.items(), itertools.accumulate(sizes.values()))}

# tinygrad schedules and lowers every kernel anew in each process (those caches live in memory): kept in its cache.db beside the compiled
# binaries, by device, model shape and engine flags, an earlier start-up's work is not done again (warm start-up, CPU, bundled model:
# 86-91 -> 17 s; H100, Llama-3.2-1B shape: 97-112 -> 19-22 s). They are pickled tinygrad objects (tinygrad internals): see setup.py's pin
STORED_CACHES = (tinygrad.schedule.schedule_cache, tinygrad.codegen.to_program_cache)
# tinygrad internals: lowering puts each compiled program in its kernel's place with UOp.substitute({kernel: program}), a rewrite that
# walks every UOp of the program and finds nothing else to replace: half of each graph capture and each eager step's host time on the CPU
# (BENCHMARKS.md, #72). A one-entry substitute of the node itself is that entry's value, which is what tinygrad's rewrite returns
tinygrad_substitute = UOp.substitute
UOp.substitute = lambda u, subs, **kw: subs[u] if not kw and subs.keys() == {u} else tinygrad_substitute(u, subs, **kw)
# the compiled kernels and BEAM results of the benchmark engines on an H100 (scripts/build_cache.py makes it), as SQL that adds to tinygrad's
# cache.db only the rows it lacks (CREATE TABLE IF NOT EXISTS, INSERT OR IGNORE): nothing the user's own cache holds is ever overwritten
SHIPPED_CACHE = os.path.join(os.path.dirname(__file__), "tinygrad-cache-sm90.sql.xz")

class ModelRunner:
  """Turns a scheduled batch into one forward pass over the flattened tokens of all its sequences (prefill chunks and decodes alike),
  writes their K/V into the paged pool, and samples on device. Each padded token-count bucket is a TinyJit graph (vLLM's CUDA graphs).
  Its jobs, and where each is done (__init__ runs the start-up's phases in order, load to capture_first_graphs; then the methods):
    compile caches    tinygrad's, across start-ups: load (read the first part), capture_first_graphs and capture_next (store them)
    devices, weights  the tensor-parallel devices, the compute dtype, model.py's weights and decoder: load
    KV pool           sized by the device's memory, cut max_model_len to it: allocate_buffers
    step buffer       the buckets and the one input buffer (step_layout): allocate_buffers; packed and launched by prepare (forward,
                      sample), its tokens read back by read and download, grammar masks by grammar_masks
    capture plan      the first units in capture_first_graphs, the rest by capture_next, which holds the policy (AsyncLLM and LLM only
                      call it)
  Every use of tinygrad internals (beyond its public Tensor, TinyJit, Device and Context) is marked "tinygrad internals" where it is:
  the stored caches (STORED_CACHES) and its cache.db connection (load), the one-entry substitute (beside STORED_CACHES), its CUDA
  bindings (cuda: KV sizing, download, read), the step buffer's device buffers (launch), TinyJit's counter (call), a captured graph's
  output (launch), and its pending host copies (download)."""
  def __init__(self, config:Config, model_dir:str):
    start, self.config, self.device, self.hf_config = time.perf_counter(), config, Device.DEFAULT, (hf_config := model.read_config(model_dir))
    # its phases, in the order they run (as nano-vllm's load_model, allocate_kv_cache and capture_cudagraph)
    self.load(config, hf_config, model_dir)
    log.info("loaded %s on %s in %s: %.1f s", model_dir, self.device, self.dtype, time.perf_counter() - start)
    self.allocate_buffers(config, hf_config)
    self.capture_first_graphs(config)
    # counted in units (a token bucket with one sampler variant), as pending is, not in graphs: units share sampler graphs, so the two
    # counts did not add up. A bucket is in once both its units are; eager runs have every bucket in and none to capture
    log.info("ready after %.1f s: %d step graph units in, %d more to capture", time.perf_counter() - start, 2 * len(self.buckets), len(self.pending))

  def load(self, config:Config, hf_config:dict, model_dir:str):
    """The start-up's first phase: tinygrad's compile caches, kept in its cache.db across start-ups (see STORED_CACHES, SHIPPED_CACHE),
    then the tensor-parallel devices, the compute dtype, model.py's weights and its decoder."""
    # the shipped cache on the arch it was built for (H200s are sm_90 too), as one transaction: 0.2 s
    if CACHELEVEL >= 1 and Device[self.device].renderer.target.arch == "sm_90": db_connection().executescript(lzma.open(SHIPPED_CACHE, "rt").read())
    # emptied first: what another engine of this process (a test suite, a notebook's second LLM) left in them would be stored under our
    # keys too (the bundled model's first-graphs entry: 0.71 MB alone, 5.0 MB after one other engine, 49 MB after the test suite)
    for cache in STORED_CACHES: cache.clear()
    # by model shape and engine flags: under one key for all of a model's configurations (the test suite's engines) every start read every
    # other configuration's entries too (the bundled model's first-graphs entry: 4.6 MB, 1.3 s of a 4.2 s CPU start; BENCHMARKS.md). Not by
    # folder: the same config.json elsewhere (a copy, bench.py's temporary folders) schedules the same kernels
    self.cache_key = f"{self.device} {hf_config} {vars(config) | {'model': None}}"
    # before the weights (the kernels that load them are in them too), and only the part the first graphs use (see capture_first_graphs):
    # all of them took 0.3-0.5 s to read here (CPU, bundled model), that part 0.02 s. The rest is read once the engine serves (capture_next)
    for cache, stored in zip(STORED_CACHES, diskcache_get("tinyvllm_caches", f"{self.cache_key} ready") or ()): cache.update(stored)
    # the server's engine thread captures graphs too, so tinygrad's one cache.db connection (made above) is remade for any thread's use
    # (tinygrad internals: its module-level connection)
    if CACHELEVEL >= 1: tinygrad.helpers._db_connection = sqlite3.connect(CACHEDB, timeout=60, isolation_level="IMMEDIATE", check_same_thread=False)
    # tensor parallel: DEVICE:0..N-1 (virtual devices on the CPU), each holding its share of every layer's heads and of the KV pool
    # the sizes they divide: attention heads, KV heads (with them the KV pool) and the MLP's width
    tp, sizes = config.tensor_parallel_size, {k: hf_config[k] for k in ("num_attention_heads", "num_key_value_heads", "intermediate_size")}
    if any(size % tp for size in sizes.values()): raise ValueError(f"tensor_parallel_size {tp} must divide the model's {sizes}")
    if tp > 1 and hf_config["moe_layers"]: raise ValueError("mixture-of-experts models run with tensor_parallel_size 1 (for now)")
    self.devices = tuple(f"{self.device}:{i}" for i in range(tp))
    # the last one opens only if all before it exist
    try: Device[self.devices[-1]]
    except Exception as e: raise ValueError(f"tensor_parallel_size {tp}: tinygrad cannot open {self.devices[-1]} ({e})") from None
    # what the model is built at: its compute dtype and context length (cut to the KV pool next). GPUs compute in the checkpoint's 16-bit
    # type (fp16 for fp32 checkpoints), the CPU in float32; a dtype the device's compiler can't build is refused here, in one sentence, not
    # deep inside the first kernel
    name = "float32" if self.device == "CPU" else "bfloat16" if (hf_config.get("torch_dtype") or hf_config.get("dtype")) == "bfloat16" else "float16"
    self.dtype = getattr(dtypes, name := name if config.dtype == "auto" else config.dtype)
    try: (Tensor([1.5], dtype=self.dtype) * 2).realize()
    except Exception as e:
      raise ValueError(f"dtype {name} fails on {self.device} ({type(e).__name__}: {str(e)[:200]}); try dtype='float32' or 'float16'") from None
    self.max_model_len = min(config.max_model_len or 4096, hf_config.get("max_position_embeddings", 4096))
    weights = model.load_weights(model_dir, hf_config, self.dtype, config.load_format == "dummy", self.devices)
    self.model = model.Transformer(hf_config, weights, self.max_model_len, self.devices)

  def allocate_buffers(self, config:Config, hf_config:dict):
    """The device's buffers: first the KV pool, per layer a K and a V pool of (num_blocks * block_size slots, KV heads, head_dim), sized
    by the device's memory, max_model_len cut to what it holds; then the step's: the one input buffer every graph reads (step_layout),
    sized for the largest of the token buckets (powers of two up to the largest step: all of them here, those captured once
    capture_first_graphs has run), the tokens the last step sampled, and the grammar masks of rows without a grammar."""
    num_layers, block_size, tp, start = hf_config["num_hidden_layers"], config.block_size, len(self.devices), time.perf_counter()
    bytes_per_block = 2 * num_layers * block_size * hf_config["num_key_value_heads"] * hf_config["head_dim"] * self.dtype.itemsize
    # by default enough for max_num_seqs sequences of max_model_len tokens, at most 4 GB; on CUDA, the one device where tinygrad tells free
    # memory, 80% of it (the rest for graphs), on each of the tensor-parallel devices
    kv_gb = config.kv_cache_memory or min(config.max_num_seqs * self.max_model_len // block_size * bytes_per_block / 1e9, 4.0)
    if config.kv_cache_memory is None and self.device == "CUDA":
      # free and total bytes
      cuda.cuMemGetInfo_v2(ctypes.byref(free := ctypes.c_size_t()), ctypes.byref(ctypes.c_size_t())); kv_gb = 0.8 * free.value / 1e9 * tp
    # one sequence must always fit the pool, or preemption can't help
    self.num_blocks = max(int(kv_gb * 1e9 // bytes_per_block), 1); self.max_model_len = min(self.max_model_len, self.num_blocks * block_size)
    shape = (self.num_blocks * block_size, hf_config["num_key_value_heads"], hf_config["head_dim"])
    # not zeroed: attention reads only slots its tokens wrote, and zeroing a large pool takes seconds on a CPU (BENCHMARKS.md, issue #40).
    # Tensor parallel: split by KV head
    self.kv = [[attention.words(gemm.empty(shape, self.dtype, self.devices, 1)).contiguous().realize() for _ in "kv"] for _ in range(num_layers)]
    log.info("KV cache: %d tokens in %d blocks, %.2f GB: %.1f s", self.num_blocks * block_size, self.num_blocks, kv_gb, time.perf_counter() - start)
    # the step's buffers: the token buckets (powers of two up to the largest step) and the one input buffer they all read
    top = max(config.max_num_batched_tokens, config.max_num_seqs); self.buckets = sorted({min(2**i, top) for i in range(top.bit_length() + 1)})
    # a row samples per sequence (the largest step is never smaller); a block-table row is as long as the longest sequence
    self.max_rows, self.max_blocks = config.max_num_seqs, -(-self.max_model_len // block_size)
    # the step's inputs on the device, one buffer that every graph reads, sized for the largest bucket: each launch overwrites the part
    # its bucket uses (see prepare)
    size = top * len(TOKEN_ROWS) + self.max_rows * (self.max_blocks + len(SAMPLE_ROWS))
    # tensor parallel: a copy on every device
    self.step_buffer = Tensor(np.zeros(size, np.int32)).to(self.devices).realize()
    # the tokens the last step sampled, on every device: the next step reads there the input token of each sequence this one sampled (the
    # scheduler's placeholder, -1 - its row), so it can launch before the host has them (vLLM's async scheduling). The host reads the first
    # device's buffer. overlap: on one CUDA GPU the tokens come down into page-locked host memory of their own as their step ends, an event
    # marking it (see download), so reading them waits for that step alone; elsewhere a read waits for every step launched
    self.sampled = Tensor.zeros(self.max_rows, dtype=dtypes.int32).contiguous().to(self.devices).realize()
    self.host_tokens, self.event, self.overlap = np.zeros(self.max_rows, np.int32), cuda.CUevent(), self.device == "CUDA" and tp == 1
    if self.overlap:
      cuda.cuMemHostRegister_v2(self.host_tokens.ctypes.data, self.host_tokens.nbytes, 0)
      cuda.cuEventCreate(ctypes.byref(self.event), 0)
    # the sampler's other input, the grammar masks: filled on llguidance's thread pool; a batch that only uses top-k/top-p reuses one
    # all-ones mask per row count, uploaded once instead of every step
    ones = lambda num_rows: Tensor(llguidance.numpy.allocate_token_bitmask(num_rows, hf_config["vocab_size"])).to(self.devices).realize()
    self.no_grammar, self.grammar_pool = functools.cache(ones), llguidance.LLExecutor()

  def capture_first_graphs(self, config:Config):
    """The capture plan: vLLM captures all its CUDA graphs before it serves. Here a unit (a token bucket's model graph and a sampler
    variant for its rows) is captured at a time: those of a decode and of a small prefill chunk now, so the engine serves at once, the
    rest later (capture_next: the server's idle time). A step runs in the smallest bucket that holds it whose plain and filtered samplers
    are both in, so no step waits for a capture, and the token budget is the largest such bucket yet. Units are (tokens, filtered)."""
    # TinyJit graphs (the model's by token bucket, the sampler's by row count), and the sizes of the stored caches as read (written back
    # only if capturing adds to them). On the CPU a prompt-sized step's graph is captured when a step first needs it, not before the engine
    # is ready: capturing one ran its step, seconds of compute there, at every start (#72). Their keys are in with no TinyJit yet, so
    # capture_next passes them and call makes each at its first use and captures it there (TinyJit's own eager first run cost the first
    # long prompt a capture more: 1.5x a replay, then 1.2x). With them in, one prompt at a time needs no graph but the first units' (LLM
    # reads lazy so)
    self.lazy = [n for n in self.buckets if n > self.max_rows and not Device[self.device].renderer.has_local]
    self.graphs, self.stored = dict.fromkeys(("model", n) for n in self.lazy), list(map(len, STORED_CACHES))
    units, first = itertools.product(self.buckets, (0, 1)), list(itertools.product((1, min(64, self.buckets[-1]), *self.lazy), (0, 1)))
    # pending: the first units (those of 1 and 64 tokens, or of the largest bucket if smaller, and the lazy buckets, which capture nothing
    # now), then the others, every bucket with each sampler variant in bucket order (dict.fromkeys keeps each unit once, at its first place)
    self.buckets, self.pending = (self.buckets, []) if config.enforce_eager else ([], list(dict.fromkeys([*first, *units])))
    while self.pending and self.pending[0] in first: self.capture_next()
    if list(map(len, STORED_CACHES)) != self.stored: diskcache_put("tinyvllm_caches", f"{self.cache_key} ready", STORED_CACHES)
    self.stored = None

  def forward(self, num_tokens:int, num_rows:int) -> Tensor:
    """The decoder over the step's tokens; returns the logits of the rows that sample."""
    inputs = {name: self.step_buffer[where] for name, where in step_layout(num_tokens, num_rows, self.max_blocks).items()}
    # (num_rows, max_blocks): a sampling row's block table
    inputs["block_tables"] = inputs["block_tables"].reshape(num_rows, self.max_blocks)
    # a token the step before sampled comes from its row of `sampled` (the scheduler's placeholder, -1 - row)
    tokens = (inputs["tokens"] >= 0).where(inputs["tokens"], self.sampled[(-1 - inputs["tokens"]).maximum(0)])
    # each layer's attention is attention.py's, given this step's inputs and the KV pool here: the model calls it without coming back
    layer_attention = functools.partial(attention.step_attention, self.kv, inputs, self.config.block_size)
    # the logits of only the rows that sample
    return self.model(tokens, inputs["positions"], layer_attention, inputs["logits_idx"])

  def sample(self, logits:Tensor, allowed:Tensor|None=None) -> Tensor:
    """Sampling is a graph of its own in two variants: the filtering one (grammar masks, top-k, top-p, min-p) costs several passes over the
    vocabulary, so a batch whose requests use none of them runs the plain one. It reads the logits' rows and no per-token input: one graph
    serves every token bucket with that many rows. The sampled token of each row goes to `sampled` (under tensor parallelism every device
    samples the same tokens), where the next step's graph and the host read it; rows that sample nothing keep theirs, so the empty steps
    of graph captures leave the tokens of the step in flight as they were."""
    inputs = {name: self.step_buffer[where] for name, where in step_layout(0, logits.shape[0], self.max_blocks).items()}
    floats = lambda name: inputs[name].bitcast(dtypes.float32)
    filters = () if allowed is None else (inputs["top_k"], floats("top_p"), floats("min_p"), allowed)
    tokens = sampler.sample(logits, floats("temperatures"), inputs["seeds"], inputs["out_positions"], *filters)
    return self.sampled[:logits.shape[0]].assign((inputs["out_positions"] > 0).where(tokens, self.sampled[:logits.shape[0]])).realize()

  def prepare(self, batch:list[tuple[sequence.Sequence, int]], num_tokens:int|None=None, filtered=False) -> tuple:
    """Packs the step that computes num_new tokens of each (seq, num_new). Returns its launch, which queues it on the device (and gives
    `sampled`, which it writes); the sequences that sample a token in it (those whose last token it computes), in batch order; and
    whether it may launch before the host has read the step before (async scheduling): with overlap (see allocate_buffers), unless grammar
    masks need that step's tokens."""
    block_size, vocab_size = self.config.block_size, self.hf_config["vocab_size"]
    # -- per sequence: one Python pass gathers each sequence's scalars, then all per-token and per-block work is numpy: a loop of numpy
    # calls per sequence cost ~8 ms of host time a step at batch 256, which the GPU would spend idle
    scalars = [(s.num_computed_tokens, num_new, len(s), len(s.block_table), s.seed, s.params.top_k) for s, num_new in batch]
    # (len(batch),) each; total: the step's real tokens
    num_cached, num_new, length, num_blocks, seed, top_k = np.array(scalars, int).reshape(-1, 6).T; total = int(num_new.sum())
    # the per-sequence floats, which travel as float32 bits
    floats = [(s.params.temperature, s.params.top_p, s.params.min_p) for s, _ in batch]
    # (len(batch),) each, float32 bits as int32
    temperature, top_p, min_p = np.array(floats, np.float32).view(np.int32).reshape(-1, 3).T
    # -- the step buffer's part for the smallest bucket that holds the step (or the one asked for): num_tokens tokens, num_rows rows
    num_tokens = num_tokens or next(b for b in self.buckets if b >= total)
    layout = step_layout(num_tokens, num_rows := min(num_tokens, self.max_rows), self.max_blocks)
    # (layout's last stop,): the bucket's part of the step buffer, which launch copies to the device
    packed = np.zeros(max(where.stop for where in layout.values()), np.int32)
    # inputs are views: writing one writes packed. block_tables: (num_rows, max_blocks), sequence i's table in row i
    inputs = {name: packed[where] for name, where in layout.items()}; block_tables = inputs["block_tables"].reshape(num_rows, self.max_blocks)
    block_tables[:len(batch)][np.arange(self.max_blocks) < num_blocks[:, None]] = list(itertools.chain(*(s.block_table for s, _ in batch)))
    # -- per token, (total,) each (the bucket's tokens past total are padding): its sequence, position, cached length and KV slot
    seq_of_token = np.repeat(np.arange(len(batch)), num_new)
    positions = np.arange(total) - np.repeat(np.cumsum(num_new) - num_new, num_new) + num_cached[seq_of_token]
    inputs["positions"][:total], inputs["token_seq"][:total], inputs["cached_lens"][:total] = positions, seq_of_token, num_cached[seq_of_token]
    # padding tokens write nowhere
    inputs["slots"][:] = -1; inputs["slots"][:total] = block_tables[seq_of_token, positions // block_size] * block_size + positions % block_size
    # -- per sampling row, (len(row_seq),) each: a sequence samples once the step computes its last token (its prompt is done), so each
    # value of its row is its own: that token's index in the step, the position of the token it draws (its length), and its per-sequence
    # values ((len(batch),) each; top_k 0 and -1, off, become the whole vocabulary)
    row_seq = np.flatnonzero(num_cached + num_new >= length)
    per_row = {"logits_idx": np.cumsum(num_new) - 1, "out_positions": length, "seeds": seed, "temperatures": temperature,
               "top_p": top_p, "min_p": min_p, "top_k": np.where(top_k > 0, np.minimum(top_k, vocab_size), vocab_size)}
    for name, values in per_row.items(): inputs[name][:len(row_seq)] = values[row_seq]
    sampling = [batch[i][0] for i in row_seq]
    filtered = filtered or any(s.matcher or s.params.top_k > 0 or s.params.top_p < 1 or s.params.min_p > 0 for s in sampling)
    # -- the launch: call runs one graph (made on its first use); launch copies the packed inputs in, then runs the model's graph and
    # the sampler's
    # each graph is a TinyJit; the sizes (ints) are baked in at capture
    def call(graph:tuple, fxn, *args, **sizes):
      # captured on its first call, skipping TinyJit's eager first run (tinygrad internals: its call counter; everything it would realize
      # once is realized at load). The step
      # buffer is read where it lies, not passed in: tinygrad rewrites every graph node that reads an input at each replay (tinygrad
      # internals: its CUDA graph), hundreds a step for a 48-layer model, host time the GPU waits for. So the graph keeps its constant
      # kernels too (TinyJit's prune would take every kernel of the step buffer for a constant)
      if (jit := self.graphs.get(graph)) is None: jit = self.graphs[graph] = TinyJit(fxn); jit.cnt = 1
      return (fxn if self.config.enforce_eager else jit)(*args, **sizes)
    def launch(model_graph=None) -> Tensor:
      # (total,): the step's input tokens, packed last: a token the step before samples is its placeholder until the host receives it
      inputs["tokens"][:total] = np.fromiter(itertools.chain(*(s.token_ids[(c := s.num_computed_tokens):c + num_new] for s, num_new in batch)), int)
      # one host-to-device copy into the part of the input buffer the bucket uses: a Tensor made of the array would go through tinygrad's
      # scheduler inside the TinyJit call, Python that kept the GPU idle (the calls took 3.3 ms a step at batch 256 on the H100, now 0.36)
      # each device's copy (a MultiBuffer's bufs; tinygrad internals: its buffers' allocators). Host-visible memory (METAL, PYTHON, CPU:
      # _as_buffer) is copied into as a whole view, so it gets a view of the copy's size (_offset); the others (CUDA, HIP, AMD, CL, WEBGPU)
      # copy len(src) bytes from the address given, and CL's and WEBGPU's allocators have no _offset
      for dev in getattr(buffer := self.step_buffer.uop.buffer, "bufs", [buffer]):
        dest = dev.allocator._offset(dev._buf, packed.nbytes, 0) if hasattr(dev.allocator, "_as_buffer") else dev._buf
        dev.allocator._copyin(dest, memoryview(packed).cast("B"))
      # a capture of a sampler alone (capture_next: its bucket's model graph is in) reads the logits that graph wrote last (tinygrad
      # internals: a captured graph's output), rather than running the step again for them (on the CPU, seconds at 64 tokens: BENCHMARKS.md)
      if model_graph: logits = model_graph.captured.ret
      else: logits = call(("model", num_tokens), self.forward, num_tokens=num_tokens, num_rows=num_rows)
      return call(("sampler", filtered, num_rows), self.sample, logits, *([self.grammar_masks(sampling, num_rows)] if filtered else []))
    return launch, sampling, self.overlap and not any(s.matcher for s in sampling)

  def read(self, num_rows:int) -> list[int]:
    """The tokens of the step last downloaded, once it has run (without overlap: once every step launched has run)."""
    if self.overlap: cuda.cuEventSynchronize(self.event)
    return (self.host_tokens if self.overlap else getattr(self.sampled.uop.buffer, "bufs", [self.sampled.uop.buffer])[0].numpy())[:num_rows].tolist()

  def download(self, num_rows:int):
    """With overlap: queue the copy of the last step's tokens to the host and the event that marks their arrival, once the host has read
    the step before (tinygrad internals: its host-to-device copies stage through page-locked memory that it frees only as it
    synchronizes, which async steps never do: every 64 steps, it does)."""
    if not self.overlap: return
    cuda.cuMemcpyDtoHAsync_v2(self.host_tokens.ctypes.data, self.sampled.uop.buffer._buf, 4 * num_rows, None)
    cuda.cuEventRecord(self.event, None)
    if len(Device[self.device].pending_copyin) > 64: Device[self.device].synchronize()

  def grammar_masks(self, sampling:list[sequence.Sequence], num_rows:int) -> Tensor:
    """Each sampling row's allowed tokens as a bitmask from its grammar's matcher; rows without a grammar allow every token."""
    if not (matchers := [(seq.matcher, row) for row, seq in enumerate(sampling) if seq.matcher]): return self.no_grammar(num_rows)
    # on llguidance's thread pool, while the GPU runs the step's forward pass (launched before this is called)
    bitmask = llguidance.numpy.allocate_token_bitmask(num_rows, self.hf_config["vocab_size"])
    llguidance.numpy.fill_next_token_bitmask_par(self.grammar_pool, matchers, bitmask); return Tensor(bitmask).to(self.devices)

  def capture_next(self, num_seqs:int|None=None) -> tuple | None:
    """The capture policy, after the first units (capture_first_graphs'): capture the first pending unit, and return it (it stays pending
    until it is in); after the last, store the caches they filled. Busy (num_seqs: the sequences running and waiting), a capture is a pause
    between steps, taken only for a bucket that holds them while the bucket they run in is twice as wide or more, or none holds them (else
    None), the smallest first: two captures buy a bucket, its plain sampler, then its filtered one. So a server busy from its first
    request gets the buckets its load runs in within seconds, not once it idles. Idle (AsyncLLM's) or offline (LLM's), the units go in
    order. BEAM, when asked for, tunes only the decode-sized graphs."""
    wanted = lambda size: num_seqs is None or num_seqs <= size and not any(num_seqs <= b < 2 * size for b in self.buckets)
    self.pending.sort(key=lambda unit: not wanted(unit[0]))
    if not (self.pending and wanted(self.pending[0][0])): return None
    # the first unit after the engine's first graphs: the rest of the stored caches (see load)
    if self.stored is None:
      for cache, stored in zip(STORED_CACHES, diskcache_get("tinyvllm_caches", self.cache_key) or ()): cache.update(stored)
      self.stored = list(map(len, STORED_CACHES))
    # a unit whose graphs are in runs no step: the filtered unit of a bucket wider than max_rows, whose sampler graph an earlier bucket of
    # as many rows captured (on the CPU, 3 steps of 128-512 tokens, seconds each). One whose model graph is in (a filtered unit after its
    # plain one) captures its sampler alone, on the logits that graph wrote last (see launch)
    if not {("model", (unit := self.pending[0])[0]), ("sampler", unit[1], min(unit[0], self.max_rows))} <= self.graphs.keys():
      with Context(BEAM=self.config.beam if unit[0] <= self.max_rows else 0):
        self.prepare([], *unit)[0](self.graphs.get(("model", unit[0])))
    # its filtered sampler in (after its plain one): steps may use it
    if unit[1]: self.buckets = sorted({*self.buckets, unit[0]})
    if len(self.pending) > 1: return self.pending.pop(0)
    # how many kernels they lowered and compiled says whether cache.db held them
    log.info("all %d step graph units captured: %d kernels lowered since ready", 2 * len(self.buckets), len(STORED_CACHES[1]) - self.stored[1])
    # written back only if this start-up added to them: pickling ~40 MB takes seconds
    if list(map(len, STORED_CACHES)) != self.stored: diskcache_put("tinyvllm_caches", self.cache_key, STORED_CACHES)
    return self.pending.pop(0)
