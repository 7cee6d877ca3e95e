"""The engine, first stop of a request below the server: serve.py -> llm_engine -> scheduler -> model_runner / block_manager. LLMEngine
checks a prompt, makes it a Sequence and runs the step loop (schedule, launch, receive, advance: see step), and is vLLM's output
processor too: a sampled token back to text, stop checks and the request's output (process_output), with the tokenizer it owns. LLM is
the offline API over it, AsyncLLM the server's (the loop on a background thread, fed through an inbox). It owns the tokenizer, the
scheduler and the runner, and reaches the device only through the runner."""
import asyncio, dataclasses, functools, gc, os, queue, random, threading, time, uuid, tinygrad.helpers
from tinyvllm.config import Config, log, model_path, select_device
from tinyvllm.sequence import SamplingParams, Sequence, CompletionOutput, RequestOutput
from tinyvllm.tokenizer import Tokenizer, grammar_tokenizer, compile_grammar, LLMatcher
from tinyvllm import block_manager, model_runner, scheduler

# the server captures a pending graph only after this long without work, so a client's next request, sent as its last reply ends, never
# waits for a capture (a capture is a unit of up to seconds: a bucket's model graph or a sampler variant, its kernels compiled if new).
# The rest of the capture policy is ModelRunner's (capture_next)
IDLE_CAPTURE_S = 0.5

class EngineError(RuntimeError):
  """The step that held these requests failed: they were aborted (their blocks are back) and the engine carries on without them."""
  def __init__(self, request_ids:list[str]): super().__init__("the engine failed while running this request"); self.request_ids = request_ids

class LLMEngine:
  """The engine loop of vLLM: requests in, one scheduler step + one model step per iteration, text deltas out."""
  def __init__(self, config:Config):
    # the rng seeds requests that bring none; the process's global `random` stays the user's
    self.device, self.rng = select_device(config.device), random.Random(config.seed)
    # defaults sized by the device, as vLLM's: a GPU batches wide at no cost to one stream (decode's GEMV reads the weights once for every
    # row), the CPU keeps start-up and each step short
    config = dataclasses.replace(config, **{name: getattr(config, name) or (gpu if self.device.split(":")[0] != "CPU" else cpu) for name, gpu, cpu in
                                            (("max_num_seqs", 256, 64), ("max_num_batched_tokens", 2048, 512))})
    self.tokenizer, self.runner = Tokenizer(model_dir := model_path(config.model)), model_runner.ModelRunner(config, model_dir)
    self.model_name = os.path.basename(model_dir.rstrip("/")) if config.model is None or os.path.isdir(config.model) else config.model
    # the resolved config (the context length the model and the KV pool allow) flows on; the caller's Config is left as it was
    self.config = config = dataclasses.replace(config, max_model_len=self.runner.max_model_len)
    self.block_manager = block_manager.BlockManager(self.runner.num_blocks, config.block_size, config.enable_prefix_caching)
    self.scheduler = scheduler.Scheduler(config, self.block_manager)
    # requests: request id -> its sequence; in_flight: the sequences that sample in the step launched last, whose tokens the host has
    # not read yet
    self.requests, self.in_flight, self.grammar_tokenizer = {}, [], grammar_tokenizer(self.tokenizer, self.runner.hf_config["vocab_size"])
    # counters, for serve.py's metrics
    self.num_prompt_tokens = self.num_generation_tokens = 0

  def check(self, prompt:str|list[int]|dict, params:SamplingParams, matcher=None) -> tuple[list[int], LLMatcher | None]:
    """A request's prompt, in any of vLLM's forms (text, token ids, {"prompt": text} or {"prompt_token_ids": ids}), as checked token ids,
    and its grammar compiled into its matcher, unless the caller compiled it already (matcher: chat.py's for the server, off the engine
    thread; LLM.generate's first check): once per request. A bad request raises ValueError before anything of it is queued."""
    if isinstance(prompt, dict): prompt = prompt["prompt_token_ids"] if "prompt_token_ids" in prompt else prompt.get("prompt")
    ids, vocab_size = self.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt, self.runner.hf_config["vocab_size"]
    if not isinstance(ids, list) or not all(type(t) is int and 0 <= t < vocab_size for t in ids):
      raise ValueError(f"a prompt is a string, a list of token ids in [0, {vocab_size}), {{'prompt': str}} or {{'prompt_token_ids': [int, ...]}}")
    if not 0 < len(ids) < self.config.max_model_len:
      raise ValueError(f"prompt has {len(ids)} tokens; it must have between 1 and {self.config.max_model_len - 1} (max_model_len)")
    return ids, matcher or params.structured_outputs and compile_grammar(params.structured_outputs, self.grammar_tokenizer)

  def add_request(self, prompt:str|list[int]|dict, params:SamplingParams, request_id:str|None=None, matcher=None) -> str:
    ids, matcher = self.check(prompt, params, matcher)
    if (request_id := request_id or uuid.uuid4().hex) in self.requests: raise ValueError(f"request id {request_id!r} is already running")
    # the step buffer carries 31 bits of the seed
    seed = params.seed if params.seed is not None else self.rng.getrandbits(31)
    seq = Sequence(request_id, ids, params, seed & 0x7fffffff, self.tokenizer.detokenizer(ids), matcher)
    self.requests[request_id] = seq; self.scheduler.waiting.append(seq); return request_id

  def abort(self, request_id:str):
    if request_id in self.requests: self.scheduler.finish(self.requests.pop(request_id))

  def has_unfinished(self) -> bool: return bool(self.requests)

  def step(self) -> list[RequestOutput]:
    """One engine iteration, as vLLM's async scheduling: while the GPU runs step N (launched by the call before), step N+1 is scheduled,
    packed and launched (its input tokens that N samples are read on the device), then N's tokens are read and turned into outputs while
    the GPU runs N+1. Its phases, in order:
    1. schedule N+1 (scheduler.schedule) and pack it (runner.prepare);
    2. launch it, where it may run ahead of N's tokens (see ModelRunner.prepare);
    3. read N's tokens and put them in place of their placeholders (runner.read, scheduler.receive, which drops the tokens of sequences
       already finished: one that N finished computed one more token in N+1);
    4. launch N+1 now where it could not run ahead (its grammar masks need N's tokens), and queue its tokens' copy to the host
       (runner.download);
    5. N's kept tokens as outputs: detokenized and stop-checked while the GPU runs N+1 (process_output);
    6. N+1's tokens count as computed, and its sampling sequences hold placeholders for them (scheduler.advance, which skips the sequences
       phase 5 just finished).
    Returns a delta (new text and token ids) for each request whose sequence produced a token.
    The placeholders, a sampling sequence's last token while the GPU draws it:
    - written by Scheduler.advance right after the launch: -1 - the sequence's row in the step's sampled tokens;
    - read by the next step: ModelRunner.prepare packs it as an input token, and the graph takes that row of ModelRunner.sampled, which
      the step before wrote on the device (ModelRunner.forward);
    - replaced by Scheduler.receive with the token itself, once the host has read it (ModelRunner.read);
    - never written for a sequence process_output has just finished (advance skips it), though a step launched meanwhile computed it for
      nothing; Scheduler.receive drops that step's token."""
    batch, sampling = self.scheduler.schedule(self.runner.buckets[-1]), self.in_flight
    try:
      launch, self.in_flight, ahead = self.runner.prepare(batch) if batch else (lambda: None, [], False)
      if ahead: launch()
      kept = self.scheduler.receive(sampling, self.runner.read(len(sampling)) if sampling else [])
      if not ahead: launch()
      self.runner.download(len(self.in_flight))
      outputs = [self.process_output(seq, token, length) for seq, token, length in kept]
      self.scheduler.advance(batch, self.in_flight)
    except Exception as e:
      # only the requests of the failed steps fail: aborted here, they give their blocks back
      failed, self.in_flight = list(dict.fromkeys(seq.request_id for seq in sampling + [seq for seq, _ in batch])), []
      for request_id in failed: self.abort(request_id)
      raise EngineError(failed) from e
    return outputs

  def process_output(self, seq:Sequence, token:int, length:int) -> RequestOutput:
    """vLLM's output processing, of a token the scheduler kept (see step): counts it, detokenizes it with the sequence's detokenizer
    (add_request's), checks the stop conditions (finishing the sequence on one) and returns the request's delta, with the text decided;
    text that could be the start of a stop string is held back until it is decided."""
    params, searched, eos_ids = seq.params, len(seq.held_text), self.tokenizer.eos_ids
    # its first token: its prompt is done
    if length == seq.num_prompt_tokens + 1: self.num_prompt_tokens += seq.num_prompt_tokens
    # only the unemitted tail is kept, so a token's work doesn't grow with the output's length
    self.num_generation_tokens += 1; seq.held_text += seq.detok(token) or ""; reason = stop_reason = None
    # EOS, or the end of its grammar
    if token in eos_ids and not params.ignore_eos or seq.matcher and (seq.matcher.is_error() or seq.matcher.is_stopped()): reason = "stop"
    # a match can only start in the new text or in the len(stop) - 1 held characters before it
    for stop in params.stop:
      if (i := seq.held_text.find(stop, max(0, searched - len(stop) + 1))) >= 0:
        seq.held_text = seq.held_text[:i]; reason, stop_reason = "stop", stop
    if reason is None and (length - seq.num_prompt_tokens >= params.max_tokens or length >= self.config.max_model_len): reason = "length"
    # a finished request leaves the engine with its last delta. It holds no placeholder: the step's advance, after this, skips it
    if reason: self.scheduler.finish(self.requests.pop(seq.request_id))
    emit = len(seq.held_text) if reason else max(0, len(seq.held_text) - max((len(s) - 1 for s in params.stop), default=0))
    out, seq.held_text = CompletionOutput(0, seq.held_text[:emit], [token], reason, stop_reason), seq.held_text[emit:]
    return RequestOutput(seq.request_id, seq.prompt_token_ids, [out], reason is not None)

class LLM:
  """Offline batch generation, as vLLM's `LLM`: everything given is batched through the engine at once."""
  def __init__(self, model:str|None=None, device:str|None=None, **kwargs):
    self.engine = LLMEngine(Config(model=model, device=device, **kwargs))
    # every graph before the first batch: the buckets a step may use never depend on timing, so offline runs are repeatable. On the CPU
    # the prompt-sized buckets are in from ready (ModelRunner.capture_first_graphs), and one prompt at a time decodes in the first graphs:
    # the others are captured before the first batch of several prompts (generate), and LLM() is ready with its engine (#72). A GPU
    # captures them all here, under a progress bar
    if not self.engine.runner.lazy:
      for _ in tinygrad.helpers.tqdm(list(self.engine.runner.pending), desc="capturing graphs"): self.engine.runner.capture_next()

  def generate(self, prompts, sampling_params:SamplingParams|list[SamplingParams]|None=None, use_tqdm=True) -> list[RequestOutput]:
    """prompts: one prompt or a list of them, in any of vLLM's forms (see LLMEngine.check). Every prompt and grammar is checked before any
    request is queued, and nothing of this call stays queued if it raises, so a bad request leaves the engine as it was."""
    prompts = [prompts] if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)) else list(prompts)
    params = sampling_params if isinstance(sampling_params, list) else [sampling_params or SamplingParams()] * len(prompts)
    if len(params) != len(prompts): raise ValueError(f"got {len(prompts)} prompts but {len(params)} sampling params")
    # all of them checked, and their grammars compiled, before any is queued
    checked = [self.engine.check(prompt, sp) for prompt, sp in zip(prompts, params)]
    # on the CPU, the graphs LLM() left for a batch of several prompts (see __init__); on a GPU none is pending by now
    for _ in range(len(self.engine.runner.pending) if len(prompts) > 1 else 0): self.engine.runner.capture_next()
    # each with an empty output per sequence that its deltas are added to
    request_ids = [self.engine.add_request(ids, sp, matcher=matcher) for (ids, matcher), sp in zip(checked, params)]
    results = {rid: RequestOutput(rid, ids, [CompletionOutput(0, "", [])]) for rid, (ids, _) in zip(request_ids, checked)}
    bar, start, num_tokens = tinygrad.helpers.tqdm(total=len(results), desc="generate", disable=not use_tqdm), time.perf_counter(), 0
    try:
      while self.engine.has_unfinished():
        for out in self.engine.step():
          result = results[out.request_id]; result.finished = out.finished
          # offline outputs are whole
          for delta in out.outputs: result.outputs[delta.index] += delta; num_tokens += len(delta.token_ids)
          bar.update(out.finished)
        bar.set_description(f"generate {num_tokens / (time.perf_counter() - start):.0f} tok/s")
    finally:
      # after an error, none of this call's requests is left behind
      for rid in results: self.engine.abort(rid)
    return list(results.values())

  def chat(self, messages:list, sampling_params:SamplingParams|list[SamplingParams]|None=None, use_tqdm=True) -> list[RequestOutput]:
    """vLLM's LLM.chat: one conversation (a list of {"role", "content"} messages) or a list of them, through the model's chat template."""
    conversations = [messages] if messages and isinstance(messages[0], dict) else messages
    return self.generate([self.engine.tokenizer.encode_chat(c) for c in conversations], sampling_params, use_tqdm)

class AsyncLLM:
  """The server's engine: the loop runs in one background thread; each request is an async iterator of deltas on the caller's event loop.
  New requests and aborts go through an inbox that the engine thread applies between steps, so the event loop never waits for a step."""
  def __init__(self, config:Config):
    # work: set when the engine thread has something to do; inbox: (request id, the engine's method to call for it between steps,
    # add_request or abort, and its arguments); queues: request id -> the put of the queue its outputs go to, run on its caller's event loop
    self.engine, self.work, self.inbox, self.healthy, self.queues = LLMEngine(config), threading.Event(), queue.SimpleQueue(), True, {}
    # the 0.9-1.4M objects of the model, its graphs and tinygrad's caches live as long as the server: frozen, no later full collection
    # walks them (each was a 0.1-0.4 s stall of the engine loop). Not for offline LLMs, whose engines must stay collectable once dropped.
    # No collection first: it found ~20 objects to free here, in 0.1 s before the server could answer
    gc.freeze(); threading.Thread(target=self.loop, daemon=True, name="tinyvllm-engine").start()

  def capture(self, num_seqs:int|None=None):
    # the pending unit the runner's capture policy takes now (ModelRunner.capture_next: idle, the next; busy, num_seqs, maybe none), frozen
    # out of the collector with the rest; one that fails is left out, and steps keep to the others
    try:
      if self.engine.runner.capture_next(num_seqs): gc.collect(); gc.freeze()
    except Exception: log.exception("capturing a step graph failed"); self.engine.runner.pending.pop(0)

  def loop(self):
    """The engine thread: wait for work (capturing pending graphs while idle), apply the inbox, run one step, hand each output to its
    caller's event loop."""
    while True:
      # idle: the pending graphs are captured one at a time (a request that arrives during one waits for it)
      while not self.work.wait(IDLE_CAPTURE_S if self.engine.runner.pending else None): self.capture()
      # outs: (request id, its output or its error), delivered after the step
      outs: list[tuple[str, RequestOutput | Exception]] = []
      while not self.inbox.empty():
        request_id, call, args = self.inbox.get()
        # a request the engine refuses fails alone
        try: call(*args)
        except Exception as e: outs.append((request_id, e))
      # busy: a capture's pause between steps, for a bucket the sequences need (ModelRunner.capture_next); the engine's requests are its
      # sequences, running and waiting
      self.capture(len(self.engine.requests))
      try: outs += [(out.request_id, out) for out in self.engine.step()]
      except Exception as e:
        # the failed step's requests fail alone; if even an empty step can't run, the engine is broken
        log.exception("engine step failed"); failed = e.request_ids if isinstance(e, EngineError) else list(self.engine.requests)
        for request_id in failed: self.engine.abort(request_id); outs.append((request_id, EngineError(failed)))
        # an empty step, its tokens read
        try: self.engine.runner.prepare([], self.engine.runner.buckets[0])[0]().tolist()
        except Exception: self.healthy = False; log.exception("the engine cannot run an empty step: it is unhealthy")
      # clear, then look again: a request that arrived meanwhile set the event after our last check
      self.work.clear()
      if self.engine.has_unfinished() or not self.inbox.empty(): self.work.set()
      # a request whose caller has gone has no queue: its outputs go nowhere
      for request_id, out in outs: self.queues.get(request_id, lambda out: None)(out)

  async def generate(self, prompt_token_ids:list[int], params:SamplingParams, request_id:str, matcher:LLMatcher|None=None):
    outputs, finished = asyncio.Queue(), False
    self.queues[request_id] = functools.partial(asyncio.get_running_loop().call_soon_threadsafe, outputs.put_nowait)
    self.inbox.put((request_id, self.engine.add_request, (prompt_token_ids, params, request_id, matcher))); self.work.set()
    try:
      while not finished:
        if isinstance(out := await outputs.get(), Exception): raise out
        finished = out.finished; yield out
    finally:
      # the consumer went away (client disconnect) before the end: the request's blocks go back now
      self.queues.pop(request_id, None)
      if not finished: self.abort(request_id)

  def abort(self, request_id:str): self.inbox.put((request_id, self.engine.abort, (request_id,))); self.work.set()
