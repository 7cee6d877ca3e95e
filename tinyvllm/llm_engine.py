import asyncio, gc, queue, random, threading, time, traceback, uuid
from tinygrad.helpers import tqdm
from tinyvllm.config import Config, BUNDLED_MODEL, select_device
from tinyvllm.sequence import SamplingParams, Sequence, CompletionOutput, RequestOutput
from tinyvllm.tokenizer import Tokenizer, IncrementalDetokenizer
from tinyvllm.block_manager import BlockManager
from tinyvllm.scheduler import Scheduler

class LLMEngine:
  """The engine loop of vLLM: requests in, one scheduler step + one model step per iteration, text deltas out."""
  def __init__(self, config:Config):
    self.config, self.device = config, select_device(config.device)
    random.seed(config.seed)
    from tinyvllm.model_runner import ModelRunner   # imported after select_device, so no tensor is made on the wrong device
    self.tokenizer, self.model_name = Tokenizer(config.model or BUNDLED_MODEL), (config.model or BUNDLED_MODEL).rstrip("/").split("/")[-1]
    self.runner = ModelRunner(config)
    self.block_manager = BlockManager(self.runner.num_blocks, config.block_size, config.enable_prefix_caching)
    self.scheduler = Scheduler(config, self.block_manager)
    self.requests: dict[str, list[Sequence]] = {}
    self.prompt_tokens = self.generation_tokens = 0
    if not config.enforce_eager: self.runner.warmup()

  def add_request(self, prompt:str|list[int], params:SamplingParams, request_id:str|None=None) -> str:
    ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    if not ids or len(ids) >= self.config.max_model_len:
      raise ValueError(f"prompt has {len(ids)} tokens; it must have between 1 and {self.config.max_model_len - 1} (max_model_len)")
    if not all(0 <= t < (vocab := self.runner.hf["vocab_size"]) for t in ids): raise ValueError(f"prompt token ids must be in [0, {vocab})")
    if (request_id := request_id or uuid.uuid4().hex) in self.requests: raise ValueError(f"request id {request_id!r} is already running")
    parent = Sequence(request_id, ids, params)
    self.requests[request_id] = seqs = [parent] + [Sequence(request_id, ids, params, i, parent) for i in range(1, params.n)]
    for seq in seqs: seq.detok = IncrementalDetokenizer(self.tokenizer, ids)
    self.scheduler.waiting.extend(seqs)
    return request_id

  def abort(self, request_id:str):
    for seq in self.requests.pop(request_id, []): self.scheduler.finish(seq, "abort")

  def has_unfinished(self) -> bool: return bool(self.requests)

  def step(self) -> list[RequestOutput]:
    """One engine iteration. Returns a delta (new text and token ids) for each request whose sequences produced output."""
    if not (batch := self.scheduler.schedule()): return []
    sampled = iter(self.runner.run(batch))
    deltas: dict[str, list[CompletionOutput]] = {}
    for seq, n in batch:
      seq.num_computed_tokens += n
      self.block_manager.commit(seq)
      if seq.num_computed_tokens < len(seq): continue                      # mid-prompt chunk: nothing sampled yet
      self.prompt_tokens += seq.num_prompt_tokens if seq.first_token_time is None else 0
      seq.first_token_time, token = seq.first_token_time or time.monotonic(), next(sampled)
      seq.token_ids.append(token); self.generation_tokens += 1
      deltas.setdefault(seq.request_id, []).append(self.process_token(seq, token))
    return [self.request_output(rid, outs) for rid, outs in deltas.items()]

  def process_token(self, seq:Sequence, token:int) -> CompletionOutput:
    """Detokenize, then check stop conditions; text that could be the start of a stop string is held back until it is decided."""
    p, old_len = seq.params, len(seq.held_text)
    seq.held_text += seq.detok.add([token])   # only the unemitted tail is kept, so a token's work doesn't grow with the output's length
    reason = "stop" if token in p.stop_token_ids or (token in self.tokenizer.eos_ids and not p.ignore_eos) else None
    for s in p.stop:
      if (i := seq.held_text.find(s, max(0, old_len - len(s) + 1))) >= 0: seq.held_text, reason = seq.held_text[:i], "stop"
    if reason is None and (len(seq) - seq.num_prompt_tokens >= p.max_tokens or len(seq) >= self.config.max_model_len): reason = "length"
    if reason: self.scheduler.finish(seq, reason); seq.finish_time = time.monotonic()
    emit = len(seq.held_text) if reason else max(0, len(seq.held_text) - max((len(s) - 1 for s in p.stop), default=0))
    text, seq.held_text = seq.held_text[:emit], seq.held_text[emit:]
    return CompletionOutput(seq.index, text, [token], reason)

  def request_output(self, rid:str, outs:list[CompletionOutput]) -> RequestOutput:
    seqs = self.requests[rid]
    if not all(s.is_finished for s in seqs): return RequestOutput(rid, seqs[0].prompt_token_ids, outs)
    del self.requests[rid]
    metrics = {"arrival_time": seqs[0].arrival_time, "first_token_time": min(s.first_token_time for s in seqs),
               "finish_time": max(s.finish_time for s in seqs), "num_prompt_tokens": seqs[0].num_prompt_tokens,
               "num_generation_tokens": sum(len(s.output_ids) for s in seqs)}
    return RequestOutput(rid, seqs[0].prompt_token_ids, outs, True, metrics)

  def stats(self) -> dict:
    bm, sch = self.block_manager, self.scheduler
    return {"num_running": len(sch.running), "num_waiting": len(sch.waiting), "num_blocks": bm.num_blocks, "num_free_blocks": bm.num_free,
            "kv_cache_usage": 1 - bm.num_free / bm.num_blocks, "prefix_cache_queries": bm.queries, "prefix_cache_hits": bm.hits,
            "num_preemptions": sch.num_preemptions, "prompt_tokens": self.prompt_tokens, "generation_tokens": self.generation_tokens}

class LLM:
  """Offline batch generation, as vLLM's `LLM`: everything given is batched through the engine at once."""
  def __init__(self, model:str|None=None, device:str|None=None, **kwargs):
    self.engine = LLMEngine(Config(model=model, device=device, **kwargs))

  def generate(self, prompts:str|list, sampling_params:SamplingParams|list[SamplingParams]|None=None, use_tqdm=True) -> list[RequestOutput]:
    prompts = [prompts] if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)) else prompts
    params = sampling_params if isinstance(sampling_params, list) else [sampling_params or SamplingParams()] * len(prompts)
    rids = [self.engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    results = {rid: RequestOutput(rid, [], [CompletionOutput(i, "", []) for i in range(sp.n)]) for rid, sp in zip(rids, params)}
    bar, start, ntok = tqdm(total=len(rids), desc="generate", disable=not use_tqdm), time.perf_counter(), 0
    while self.engine.has_unfinished():
      for out in self.engine.step():
        res = results[out.request_id]
        res.prompt_token_ids, res.finished, res.metrics = out.prompt_token_ids, out.finished, out.metrics
        for o in out.outputs:
          r = res.outputs[o.index]; r.text, r.finish_reason = r.text + o.text, o.finish_reason; r.token_ids += o.token_ids; ntok += len(o.token_ids)
        bar.update(out.finished)
      bar.set_description(f"generate {ntok / (time.perf_counter() - start):.0f} tok/s")
    return [results[rid] for rid in rids]

class AsyncLLM:
  """The server's engine: the loop runs in one background thread; each request is an async iterator of deltas on the caller's event loop.
  New requests and aborts go through an inbox that the engine thread applies between steps, so the event loop never waits for a step."""
  def __init__(self, config:Config):
    self.engine, self.work, self.inbox = LLMEngine(config), threading.Event(), queue.SimpleQueue()
    # the ~300k objects of the model, its graphs and tinygrad's caches live as long as the server: frozen, no later full collection walks
    # them (one was a ~90 ms stall of the engine loop every few hundred steps at batch 256)
    gc.collect(); gc.freeze()
    self.queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
    threading.Thread(target=self.loop, daemon=True, name="tinyvllm-engine").start()

  def loop(self):
    while self.work.wait():
      outs: list = []
      while not self.inbox.empty():
        rid, prompt, params = self.inbox.get()
        try: self.engine.add_request(prompt, params, rid) if params else self.engine.abort(rid)
        except Exception as e: outs.append((rid, e))   # a request the engine refuses fails alone
      try: outs += self.engine.step()
      except Exception as e:   # a failing step fails the requests in it, never the engine: their blocks go back, the loop goes on
        traceback.print_exc(); outs += [(rid, e) for rid in list(self.engine.requests)]
        for rid in list(self.engine.requests): self.engine.abort(rid)
      self.work.clear()   # clear, then look again: a request that arrived meanwhile set the event after our last check
      if self.engine.has_unfinished() or not self.inbox.empty(): self.work.set()
      for out in outs:
        rid = out[0] if isinstance(out, tuple) else out.request_id
        if (q := self.queues.get(rid)): q[0].call_soon_threadsafe(q[1].put_nowait, out)

  async def generate(self, prompt_token_ids:list[int], params:SamplingParams, request_id:str):
    self.queues[request_id], finished = (asyncio.get_running_loop(), q := asyncio.Queue()), False
    self.inbox.put((request_id, prompt_token_ids, params)); self.work.set()
    try:
      while not finished:
        if isinstance(out := await q.get(), tuple): raise out[1]
        finished = out.finished
        yield out
    finally:   # the consumer went away (client disconnect) before the end: the request's blocks go back now
      self.queues.pop(request_id, None)
      if not finished: self.abort(request_id)

  def abort(self, request_id:str):
    self.inbox.put((request_id, None, None)); self.work.set()
