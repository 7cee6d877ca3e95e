"""OpenAI-compatible HTTP server (`python -m tinyvllm.serve`): one AsyncLLM behind a small Starlette app, shaped like vLLM's api_server."""
import argparse, asyncio, contextlib, dataclasses, hmac, inspect, json, logging, re, signal, time, typing, uuid, uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, Metric, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
# only for its compile workers at exit (main)
import tinygrad.engine.worker
# the engine and what it takes (Config, SamplingParams, LLMatcher), as llm_engine imports them; chat.py, and ParamError, which it raises
from tinyvllm.llm_engine import AsyncLLM, Config, EngineError, LLMatcher, SamplingParams
from tinyvllm.chat import MAX_DEPTH, MAX_VALUES, OutputParser, ParamError, json_size, request as chat_request

MAX_BODY, log = 1 << 20, logging.getLogger("tinyvllm.serve")
# the chat-completions fields we honour and their JSON types; null means the default. `user` and `safety_identifier` are opaque end-user
# ids and `prompt_cache_key` a caching hint (our prefix cache needs none): accepting them is honouring them
HONOURED = {field: kinds for kinds, fields in [((str,), "model user safety_identifier prompt_cache_key"), ((str, list), "stop"),
  ((int,), "max_tokens max_completion_tokens top_k seed n"), ((int, float), "temperature top_p min_p"), ((str, dict), "tool_choice"),
  ((bool,), "stream ignore_eos parallel_tool_calls"), ((list,), "messages tools"),
  ((dict,), "stream_options response_format structured_outputs chat_template_kwargs")] for field in fields.split()}
# OpenAI's and vLLM's other fields, each with the values that change nothing: clients send those defaults, so they (and null) pass and any
# other value is a 400 naming the field (the penalties, logit_bias and min_tokens are the next ones to honour, issue #27 item 4). logprobs
# and top_logprobs went to pay for tensor parallelism (README, "Not supported, and why"), as did n > 1 (SamplingParams refuses it);
# stop_token_ids and include_stop_str_in_output went to pay for async scheduling (issue #62)
NOT_YET = {field: no_ops for no_ops, fields in [([False], "echo store use_beam_search continue_final_message logprobs include_stop_str_in_output"),
  ([1], "repetition_penalty best_of"), ([True], "add_generation_prompt skip_special_tokens"), ([{}], "logit_bias metadata"),
  ([0], "presence_penalty frequency_penalty min_tokens top_logprobs"), (["none", "auto"], "function_call"),
  ([[]], "functions bad_words stop_token_ids"), (["auto", "default"], "service_tier"),
  ([["text"]], "modalities"), ([], "audio prediction reasoning_effort web_search_options prompt_logprobs allowed_token_ids chat_template "
                                  "guided_json guided_regex guided_choice guided_grammar")] for field in fields.split()}

class APIError(Exception):
  """OpenAI's error body: {"error": {"message", "type", "param", "code"}}; `param` names the request field at fault."""
  def __init__(self, message, status=400, type="invalid_request_error", param=None, code=None):
    super().__init__(message); self.status, self.type, self.param, self.code = status, type, param, code
  def body(self): return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}
  def response(self): return JSONResponse(self.body(), self.status)

class OpenAIServer:
  """vLLM's api_server routes over one AsyncLLM: /v1/chat/completions (and its /render), /v1/models, /health and /metrics."""
  def __init__(self, llm:AsyncLLM, served_model_name:str|None=None, api_key:str|None=None):
    self.llm, self.api_key, self.config, self.model = llm, api_key, llm.engine.config, served_model_name or llm.engine.model_name

  def authorize(self, request):
    """The API key check of every /v1 route; /health and /metrics stay open for probes and scrapers."""
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if self.api_key and (scheme.lower() != "bearer" or not hmac.compare_digest(key.encode(), self.api_key.encode())):
      raise APIError("Incorrect API key provided.", 401, code="invalid_api_key")

  def parse(self, raw:bytes) -> tuple[list[int], SamplingParams, LLMatcher | None, dict, OutputParser]:
    """A chat request's body -> what the engine takes (the prompt's token ids, its SamplingParams and its grammar compiled into a
    matcher, or None) and what the response needs (the body, the OutputParser of its choice).
    Structured outputs, the grammar's path from the request to the mask and back:
    1. response_format, structured_outputs or a forced tool call becomes one grammar (chat.request: a JSON schema, regex, choice or Lark);
    2. compiled once, in the worker thread that runs this, into the llguidance matcher that follows the output (tokenizer.compile_grammar,
       against the vocabulary LLMEngine built once; offline, LLMEngine.check compiles it);
    3. the request's Sequence carries the matcher (LLMEngine.add_request);
    4. each step, ModelRunner.prepare runs its rows through the filtered sampler and launches only once the host has the step before's
       tokens; ModelRunner.grammar_masks fills each row's bitmask from its matcher, and sampler.sample masks the logits by it;
    5. back on the host, Scheduler.receive feeds each sampled token to the matcher (consume_token), and LLMEngine.process_output stops
       the sequence once its grammar is done (is_stopped) or broken (is_error)."""
    # NaN and Infinity, which Python's json takes and JSON has not, fail to parse as integers
    try: body = json.loads(raw, parse_constant=int)
    except (ValueError, RecursionError) as e: raise APIError(f"Invalid JSON body: {e}")
    if not isinstance(body, dict): raise APIError("The body must be a JSON object")
    # every field given (null means the default)
    for field, value in ((field, value) for field, value in body.items() if value is not None):
      # bounded before anything copies, renders or compiles it (chat.py)
      if json_size(value) > MAX_VALUES: raise APIError(f"'{field}' nests over {MAX_DEPTH} levels or holds over {MAX_VALUES} values", param=field)
      if field in NOT_YET and value not in NOT_YET[field]: raise APIError(f"'{field}' is not supported yet", param=field)
      # the exact JSON type: true is no number
      if (expected := HONOURED.get(field)) and type(value) not in expected: raise APIError(f"'{field}' has the wrong type", param=field)
    # as vLLM does
    if unknown := sorted(body.keys() - HONOURED.keys() - NOT_YET.keys()): log.warning("Unknown fields ignored: %s", unknown[:20])
    if body.get("model") not in (None, self.model): raise APIError(f"The model `{body['model']}` does not exist.", 404, "NotFoundError", "model", 404)
    # as vLLM's: stream_options that say anything need a stream
    if body.get("stream_options") and not body.get("stream"): raise APIError("'stream_options' needs stream: true", param="stream_options")
    # chat.py: messages, tools, the structured output and its compiled grammar, ...
    prompt, structured, parser, matcher = chat_request(self.llm.engine.tokenizer, self.llm.engine.grammar_tokenizer, body)
    max_tokens_field, context = next((k for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None), None), self.config.max_model_len
    # the sampling fields we honour pass under their own names (vLLM's, as SamplingParams has them) but for these two, resolved from OpenAI's
    # fields: max_tokens (by default the rest of the context), the structured output chat.py made
    resolved = {"max_tokens": body[max_tokens_field] if max_tokens_field else max(context - len(prompt), 1), "structured_outputs": structured}
    honoured = {k: v for k, v in body.items() if k in HONOURED and k in SamplingParams.__dataclass_fields__ and v is not None}
    try: params = SamplingParams(**honoured | resolved)
    except ParamError as e: raise APIError(str(e), param=max_tokens_field if e.param == "max_tokens" else e.param)
    if (total := len(prompt) + params.max_tokens) > context: raise APIError(f"This model's maximum context length is {context} tokens. "
                   f"However, you requested {total} tokens ({len(prompt)} in the messages, {params.max_tokens} in the completion).", param="messages")
    return prompt, params, matcher, body, parser

  async def chat(self, request):
    # the request itself first: its key, the engine's health, and a JSON body of at most MAX_BODY bytes
    self.authorize(request)
    if not self.llm.healthy: raise APIError("The engine has failed and cannot serve requests.", 503, "ServiceUnavailableError", code=503)
    if request.headers.get("content-type", "application/json").split(";")[0].strip().lower() != "application/json":
      raise APIError("The body must be JSON, sent as Content-Type: application/json", 415)
    raw = bytearray()
    # count what actually arrives: chunked uploads carry no Content-Length, and it may lie
    async for chunk in request.stream():
      raw.extend(chunk)
      if len(raw) > MAX_BODY: raise APIError(f"Body over {MAX_BODY} bytes", 413)
    # parsing, chat templating and tokenizing a 1 MB body take long enough to stall every stream: a worker thread does them
    prompt, params, matcher, body, parser = await asyncio.to_thread(self.parse, raw)
    # vLLM's /v1/chat/completions/render: the prompt's token ids alone, what vllm-router's cache_aware policy routes by (issue #56)
    if request.url.path.endswith("/render"): return JSONResponse({"token_ids": prompt})
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()), "model": self.model}
    # so far: choices() counts the tokens in
    usage = {"prompt_tokens": len(prompt), "completion_tokens": 0, "total_tokens": len(prompt)}
    async def choices():
      """One path for both responses: each engine output as its choice's delta, through chat.py's parser."""
      try:
        async with contextlib.aclosing(self.llm.generate(prompt, params, head["id"], matcher)) as outputs:
          async for out in outputs:
            for key in ("completion_tokens", "total_tokens"): usage[key] += len(out.outputs[0].token_ids)
            # None while the choice has nothing to say: text can lag tokens (partial UTF-8, held-back stop strings and tags)
            yield parser.feed(out.outputs[0])
      # the engine refused the request, and says why
      except ValueError as e: raise APIError(str(e))
      # a failed step's text may be a driver's or compiler's: the log has it, the client gets a generic message
      except EngineError: raise APIError("The engine failed on this request.", 500, "InternalServerError", code=500)
    if body.get("stream"):
      # vLLM's stream_options: the usage in a last chunk without choices (include_usage), and as it stands in every chunk (with
      # continuous_usage_stats too)
      if all(map((body.get("stream_options") or {}).get, ("include_usage", "continuous_usage_stats"))): head["usage"] = usage
      sse, chunk = lambda data: f"data: {json.dumps(data)}\n\n", lambda c, **kw: sse({**head, "object": "chat.completion.chunk", "choices": c, **kw})
      async def events():
        async with contextlib.aclosing(choices()) as stream:
          yield chunk([parser.choice(delta={"role": "assistant", "content": ""})])
          try:
            async for choice in stream: yield chunk([choice]) if choice else ""
            if (body.get("stream_options") or {}).get("include_usage"): yield chunk([], usage=usage)
          # the 200 is sent: the error is an event, as in vLLM
          except APIError as e: yield sse(e.body())
          yield "data: [DONE]\n\n"
      # Starlette cancels the body iterator on disconnect but never closes it; its background task (run after the stream, ended or cut
      # off) closes it, so the engine's abort runs deterministically
      stream = events()
      return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}, background=stream.aclose)
    # the parser gathers the choice's whole message
    async with contextlib.aclosing(choices()) as stream:
      # uvicorn does not cancel a handler whose client left: look between outputs, so a dropped request stops using KV blocks
      async for _ in stream:
        # leaving the block aborts the request
        if await request.is_disconnected(): return Response(status_code=499)
    return JSONResponse({**head, "choices": [parser.reply()], "usage": usage})

  async def models(self, request):
    """/v1/models: the served model, whose root is its name, never a local path."""
    return self.authorize(request) or JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model", "created": int(time.time()),
                                                    "owned_by": "tinyvllm", "root": self.model, "max_model_len": self.config.max_model_len}]})

  async def health(self, request): return Response(status_code=200 if self.llm.healthy else 503)

  # the server is its own collector (generate_latest takes any object with collect()), never the process's global registry: one per app,
  # so two servers in one process keep their own counts. vLLM's latency histograms and success counter went to pay for tensor
  # parallelism (README, "Not supported, and why")
  async def metrics(self, request): return Response(generate_latest(self), media_type=CONTENT_TYPE_LATEST)

  def collect(self):
    """The engine's own gauges and counters under vLLM's names (so its dashboards work), read at each scrape."""
    engine, bm, sch = self.llm.engine, self.llm.engine.block_manager, self.llm.engine.scheduler
    for name, value in {"vllm:num_requests_running": len(sch.running), "vllm:num_requests_waiting": len(sch.waiting),
                        "vllm:kv_cache_usage_perc": 1 - len(bm.free) / bm.num_blocks, "vllm:prefix_cache_queries_total": bm.queries,
                        "vllm:prefix_cache_hits_total": bm.hits, "vllm:num_preemptions_total": sch.num_preemptions,
                        "vllm:prompt_tokens_total": engine.num_prompt_tokens, "vllm:generation_tokens_total": engine.num_generation_tokens,
                        # raw counts: leak checks
                        "tinyvllm:num_blocks": bm.num_blocks, "tinyvllm:num_free_blocks": len(bm.free)}.items():
      # a counter's family is named without the _total its sample carries, as prometheus_client's own counters are
      family = Metric(name.removesuffix("_total"), name.split(":")[1], "counter" if name.endswith("_total") else "gauge")
      yield family.add_sample(name, {"model_name": self.model}, value) or family

def build_app(llm:AsyncLLM, served_model_name:str|None=None, api_key:str|None=None) -> Starlette:
  server = OpenAIServer(llm, served_model_name, api_key)
  # a bug's traceback goes to uvicorn's log, never to the client; a client that hangs up mid-upload is no error of ours (499, no traceback)
  not_found = lambda status: "NotFoundError" if status == 404 else "invalid_request_error"
  handlers = {APIError: lambda request, e: e.response(), ClientDisconnect: lambda request, e: Response(status_code=499),
              # a field out of range or shape: 400 naming it
              ParamError: lambda request, e: APIError(str(e), param=e.param).response(),
              HTTPException: lambda request, e: APIError(e.detail, e.status_code, not_found(e.status_code), code=e.status_code).response(),
              Exception: lambda request, e: APIError("Internal server error", 500, "InternalServerError", code=500).response()}
  return Starlette(exception_handlers=handlers, routes=[Route("/v1/chat/completions", server.chat, methods=["POST"]),
                   Route("/v1/chat/completions/render", server.chat, methods=["POST"]),
                   Route("/v1/models", server.models), Route("/health", server.health), Route("/metrics", server.metrics)])

def main():
  parser = argparse.ArgumentParser(description="tinyvllm's OpenAI-compatible server")
  # every engine option is a flag, described by the comment beside its field in config.py
  comments = dict(re.findall(r"^\s+(\w+):[^#\n]*#\s*(.+)$", inspect.getsource(Config), re.M))
  for field in dataclasses.fields(Config):
    kind = next((t for t in typing.get_args(field.type) if t is not type(None)), field.type)
    parser.add_argument("--" + field.name.replace("_", "-"), help=comments[field.name].replace("%", "%%"),
                        **({"action": argparse.BooleanOptionalAction} if kind is bool else {"type": kind}))
  parser.add_argument("--served-model-name", help="the model's name in the API; default: the model folder's or hub id's name")
  parser.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1/*")
  parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
  parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
  args = parser.parse_args(); logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  # the engine loads the model and captures its graphs before we listen, so the first request pays no JIT cost
  llm = AsyncLLM(Config(**{k: v for k, v in vars(args).items() if k in Config.__dataclass_fields__ and v is not None}))
  log.info("ready on http://%s:%d", args.host, args.port)
  # after its graceful shutdown uvicorn re-raises the signal it handled: SIGTERM's default handler killed the process before any exit
  # handler ran (exit 143, and tinygrad's compile worker pool leaked its 6 semaphores, which Python's resource tracker reported). Handled
  # as Ctrl-C, it ends in a KeyboardInterrupt like Ctrl-C's
  signal.signal(signal.SIGTERM, signal.default_int_handler)
  # uvicorn re-raises the Ctrl-C it handled; the shutdown was clean, so exit 0
  with contextlib.suppress(KeyboardInterrupt):
    uvicorn.run(build_app(llm, args.served_model_name, args.api_key), host=args.host, port=args.port, timeout_graceful_shutdown=5)
  # a SIGTERM sent to the whole process group (timeout, systemd's stop) also kills tinygrad's compile workers, one of them holding their
  # task queue's lock, and the pool's exit finalizer waits for that lock forever. Without it, exit ends the workers as daemon processes
  # (tinygrad internals: its worker pool; multiprocessing's Pool._terminate)
  if tinygrad.engine.worker.worker_pool: tinygrad.engine.worker.worker_pool._terminate.cancel()

if __name__ == "__main__": main()
