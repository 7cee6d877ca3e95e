"""OpenAI-compatible HTTP server (`python -m tinyvllm.serve`): one AsyncLLM behind a small Starlette app, shaped like vLLM's api_server."""
import argparse, asyncio, contextlib, dataclasses, hmac, inspect, json, logging, re, time, typing, uuid
import jinja2, uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from tinyvllm.config import Config
from tinyvllm.sequence import CompletionOutput, ParamError, SamplingParams
from tinyvllm.llm_engine import AsyncLLM, EngineError
from tinyvllm.sampler import compile_grammar

MAX_BODY = 1 << 20
log = logging.getLogger("tinyvllm.serve")
# the chat-completions fields we honour and their JSON types; null means the default. `user` and `safety_identifier` are opaque end-user
# ids and `prompt_cache_key` a caching hint (our prefix cache needs none): accepting them is honouring them
HONOURED = {"model": str, "messages": list, "max_tokens": int, "max_completion_tokens": int, "temperature": (int, float), "top_p": (int, float),
            "top_k": int, "min_p": (int, float), "seed": int, "n": int, "stop": (str, list), "stop_token_ids": list, "stream": bool,
            "stream_options": dict, "ignore_eos": bool, "include_stop_str_in_output": bool, "user": str, "safety_identifier": str,
            "prompt_cache_key": str, "response_format": dict, "structured_outputs": dict}
# OpenAI's and vLLM's other fields, each with the values that change nothing: clients send those defaults, so they (and null) pass and any
# other value is a 400 naming the field. Issue #14 turns most of them into features.
NOT_YET = {field: no_ops for no_ops, fields in [
  ([False], "logprobs echo store use_beam_search continue_final_message"), ([True], "parallel_tool_calls add_generation_prompt skip_special_tokens"),
  ([0], "top_logprobs presence_penalty frequency_penalty min_tokens"), ([1], "repetition_penalty best_of"), ([[]], "tools functions bad_words"),
  ([{}], "logit_bias metadata chat_template_kwargs"), (["none", "auto"], "tool_choice function_call"),
  (["auto", "default"], "service_tier"), ([["text"]], "modalities"), ([], "audio prediction reasoning_effort web_search_options prompt_logprobs "
   "allowed_token_ids chat_template guided_json guided_regex guided_choice guided_grammar")] for field in fields.split()}
SAMPLING = ("n", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "include_stop_str_in_output")
# vLLM's metric names (so its dashboards work) over engine.stats() keys; the raw block counts let tests check for leaks
METRICS = {"vllm:num_requests_running": "num_running", "vllm:num_requests_waiting": "num_waiting", "vllm:kv_cache_usage_perc": "kv_cache_usage",
           "vllm:prefix_cache_queries_total": "prefix_cache_queries", "vllm:prefix_cache_hits_total": "prefix_cache_hits",
           "vllm:num_preemptions_total": "num_preemptions", "vllm:prompt_tokens_total": "prompt_tokens",
           "vllm:generation_tokens_total": "generation_tokens", "tinyvllm:num_blocks": "num_blocks", "tinyvllm:num_free_blocks": "num_free_blocks",
           **{f"vllm:{key}_total": key for key in ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")}}
# vLLM's latency histograms (vllm:NAME_seconds) and bucket edges, so its Grafana dashboards read them unchanged
HISTOGRAMS = {
  "time_to_first_token": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560],
  "time_per_output_token": [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80],
  "e2e_request_latency": [0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680]}

class APIError(Exception):
  """OpenAI's error body: {"error": {"message", "type", "param", "code"}}; `param` names the request field at fault."""
  def __init__(self, message, status=400, type="invalid_request_error", param=None, code=None):
    super().__init__(message); self.status, self.type, self.param, self.code = status, type, param, code
  def body(self): return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}
  def response(self): return JSONResponse(self.body(), self.status)

def engine_error(e:Exception) -> APIError:
  # a failed step's text may be a driver's or compiler's: the log has it, the client gets a generic message; a ValueError says why the
  # engine refused the request
  return APIError("The engine failed while running this request.", 500, "InternalServerError", code=500) if isinstance(e, EngineError) \
    else APIError(str(e))

def choice(index:int, end:CompletionOutput|None, **content) -> dict:
  # vLLM adds stop_reason to OpenAI's choice: the stop string or token id that ended it
  return {"index": index, **content, "logprobs": None, "finish_reason": end and end.finish_reason, "stop_reason": end and end.stop_reason}

def is_text(content) -> bool:   # a string, or a list of text parts
  return isinstance(content, str) or isinstance(content, list) and all(
    isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str) for part in content)

def _reject(constant): raise ValueError(f"{constant} is not valid JSON")

class SSEResponse(StreamingResponse):
  # Starlette cancels the body iterator on disconnect but never closes it; closing it here runs the engine's abort deterministically
  async def __call__(self, scope, receive, send):
    try: await super().__call__(scope, receive, send)
    finally: await self.body_iterator.aclose()

class OpenAIServer:
  """vLLM's api_server routes over one AsyncLLM: /v1/chat/completions, /v1/models, /health and /metrics."""
  def __init__(self, llm:AsyncLLM, served_model_name:str|None=None, api_key:str|None=None):
    self.llm, self.api_key, self.config, self.tokenizer = llm, api_key, llm.engine.config, llm.engine.tokenizer
    self.model = served_model_name or llm.engine.model_name
    self.registry = CollectorRegistry()   # one per app, so two servers in one process keep their own counts
    self.registry.register(self)          # see collect()
    self.latency = {name: Histogram(f"vllm:{name}_seconds", f"Histogram of {name.replace('_', ' ')} in seconds.", ["model_name"],
                                    registry=self.registry, buckets=edges).labels(self.model) for name, edges in HISTOGRAMS.items()}
    self.successes = Counter("vllm:request_success", "finished requests", ["model_name", "finished_reason"], registry=self.registry)

  def authorize(self, request):   # every /v1 route; /health and /metrics stay open for probes and scrapers
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if self.api_key and (scheme.lower() != "bearer" or not hmac.compare_digest(key.encode(), self.api_key.encode())):
      raise APIError("Incorrect API key provided.", 401, code="invalid_api_key")

  async def read_request(self, request) -> tuple[list[int], SamplingParams, dict]:
    self.authorize(request)
    if not self.llm.healthy: raise APIError("The engine has failed and cannot serve requests.", 503, "ServiceUnavailableError", code=503)
    if request.headers.get("content-type", "application/json").split(";")[0].strip().lower() != "application/json":
      raise APIError("The body must be JSON, sent as Content-Type: application/json", 415)
    too_large = APIError(f"Body over {MAX_BODY} bytes", 413)
    if request.headers.get("content-length", "").isdigit() and int(request.headers["content-length"]) > MAX_BODY: raise too_large
    raw = bytearray()
    async for chunk in request.stream():  # chunked uploads carry no Content-Length: count what actually arrives
      raw += chunk
      if len(raw) > MAX_BODY: raise too_large
    # parsing, chat templating and tokenizing a 1 MB body take long enough to stall every stream: a worker thread does them
    return await asyncio.to_thread(self.parse, raw)

  def parse(self, raw:bytes) -> tuple[list[int], SamplingParams, dict]:
    try: body = json.loads(raw, parse_constant=_reject)
    except (ValueError, RecursionError) as e: raise APIError(f"Invalid JSON body: {e}")
    if not isinstance(body, dict): raise APIError("The body must be a JSON object")
    for field, value in body.items():
      if value is None: continue   # null means the default
      if field in NOT_YET and value not in NOT_YET[field]: raise APIError(f"'{field}' is not supported yet", param=field)
      # JSON's true is no number
      if (expected := HONOURED.get(field)) and (not isinstance(value, expected) or isinstance(value, bool) and expected is not bool):
        raise APIError(f"'{field}' has the wrong type", param=field)
    if unknown := [field for field in body if field not in HONOURED and field not in NOT_YET]:
      log.warning("The following fields were present in the request but ignored: %s", unknown[:20])   # as vLLM does
    if body.get("model") not in (None, self.model):
      raise APIError(f"The model `{body['model']}` does not exist.", 404, "NotFoundError", "model", 404)
    messages = body.get("messages")
    if not messages or not all(isinstance(m, dict) and isinstance(m.get("role"), str) and is_text(m.get("content")) for m in messages):
      raise APIError("'messages' must be a non-empty list of messages, each with a string 'role' and a 'content' that is a string or a "
                     "list of text parts", param="messages")
    try: prompt = self.tokenizer.encode_chat(messages)   # the tokenizer joins text parts with newlines, as vLLM does
    except Exception as e:   # the template's own words are for the client; a tokenizer's C++ text (lone surrogates, ...) is not
      raise APIError(f"The chat template refused the messages: {e}" if isinstance(e, jinja2.TemplateError) else
                     "The messages could not be tokenized", param="messages")
    if not prompt: raise APIError("The rendered prompt is empty", param="messages")
    max_tokens_field = next((k for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None), None)
    context = self.config.max_model_len
    max_tokens = body[max_tokens_field] if max_tokens_field else max(context - len(prompt), 1)   # default: the rest of the context
    # OpenAI's response_format as vLLM's structured outputs; the grammar is compiled here, so a bad schema is a 400 before any stream
    structured, response_format = body.get("structured_outputs"), body.get("response_format") or {"type": "text"}
    if (kind := response_format.get("type")) not in ("text", "json_object", "json_schema"):
      raise APIError("response_format's type must be text, json_object or json_schema", param="response_format")
    if kind != "text":
      schema = response_format.get("json_schema")
      structured = {"json_object": True} if kind == "json_object" else {"json": schema.get("schema") if isinstance(schema, dict) else None}
    try:
      params = SamplingParams(max_tokens=max_tokens, structured_outputs=structured, **{k: body[k] for k in SAMPLING if body.get(k) is not None})
      if structured: compile_grammar(structured, self.llm.engine.grammar_tokenizer)
    except ParamError as e:
      renamed = {"max_tokens": max_tokens_field, "structured_outputs": "structured_outputs" if body.get("structured_outputs") else "response_format"}
      raise APIError(str(e), param=renamed.get(e.param, e.param))
    if len(prompt) + params.max_tokens > context:
      raise APIError(f"This model's maximum context length is {context} tokens. However, you requested {len(prompt) + params.max_tokens} "
                     f"tokens ({len(prompt)} in the messages, {params.max_tokens} in the completion).", param="messages")
    # n sequences take n of the batch's max_num_seqs slots for the whole request: half leaves room for everyone else
    if params.n > (most_n := max(1, self.config.max_num_seqs // 2)):
      raise APIError(f"n must be at most {most_n} (half of max_num_seqs), so one request cannot fill the running batch", param="n")
    return prompt, params, body

  def account(self, out, counts:list[int]):   # per-choice token counts; on the final output, the latency metrics
    for output in out.outputs: counts[output.index] += len(output.token_ids)
    if not out.finished or not (times := out.metrics): return
    self.latency["time_to_first_token"].observe(times["first_token_time"] - times["arrival_time"])
    self.latency["e2e_request_latency"].observe(times["finish_time"] - times["arrival_time"])
    if max(counts) > 1:   # the longest choice ends last
      self.latency["time_per_output_token"].observe((times["finish_time"] - times["first_token_time"]) / (max(counts) - 1))
    self.successes.labels(self.model, out.outputs[-1].finish_reason).inc()

  async def chat(self, request):
    prompt, params, body = await self.read_request(request)
    request_id, counts = f"chatcmpl-{uuid.uuid4().hex}", [0] * params.n
    head = {"id": request_id, "object": "chat.completion", "created": int(time.time()), "model": self.model}
    usage = lambda: {"prompt_tokens": len(prompt), "completion_tokens": sum(counts), "total_tokens": len(prompt) + sum(counts)}
    if body.get("stream"):
      sse = lambda data: f"data: {json.dumps(data)}\n\n"
      chunk = lambda choices, **extra: sse({**head, "object": "chat.completion.chunk", "choices": choices, **extra})
      async def events():
        async with contextlib.aclosing(self.llm.generate(prompt, params, request_id)) as outputs:
          yield "".join(chunk([choice(i, None, delta={"role": "assistant", "content": ""})]) for i in range(params.n))
          try:
            async for out in outputs:
              self.account(out, counts)
              # text can lag tokens (partial UTF-8, held-back stop-string prefixes): only send chunks that carry something
              yield "".join(chunk([choice(output.index, output, delta={"content": output.text} if output.text else {})])
                            for output in out.outputs if output.text or output.finish_reason)
          except (EngineError, ValueError) as e: yield sse(engine_error(e).body())   # the 200 is sent: the error is an event, as in vLLM
          else:
            if (body.get("stream_options") or {}).get("include_usage"): yield chunk([], usage=usage())
          yield "data: [DONE]\n\n"
      return SSEResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    texts, ends = [""] * params.n, [None] * params.n   # ends: the output that finished each choice
    async with contextlib.aclosing(self.llm.generate(prompt, params, request_id)) as outputs:
      try:
        async for out in outputs:
          # uvicorn does not cancel a handler whose client left: look between outputs, so a dropped request stops using KV blocks
          if await request.is_disconnected(): return Response(status_code=499)   # leaving the block aborts the request
          self.account(out, counts)
          for output in out.outputs:
            texts[output.index] += output.text
            if output.finish_reason: ends[output.index] = output
      except (EngineError, ValueError) as e: raise engine_error(e)
    choices = [choice(i, ends[i], message={"role": "assistant", "content": texts[i]}) for i in range(params.n)]
    return JSONResponse({**head, "choices": choices, "usage": usage()})

  async def models(self, request):
    self.authorize(request)
    card = {"id": self.model, "object": "model", "created": int(time.time()), "owned_by": "tinyvllm", "root": self.model}   # no local path
    return JSONResponse({"object": "list", "data": [{**card, "max_model_len": self.config.max_model_len}]})

  async def health(self, request): return Response(status_code=200 if self.llm.healthy else 503)

  async def metrics(self, request): return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

  def collect(self):   # the engine's own gauges and counters, read at each scrape
    stats = self.llm.engine.stats()
    for name, key in METRICS.items():
      family = (CounterMetricFamily if name.endswith("_total") else GaugeMetricFamily)(name, key.replace("_", " "), labels=["model_name"])
      family.add_metric([self.model], stats[key])
      yield family

def build_app(llm:AsyncLLM, served_model_name:str|None=None, api_key:str|None=None) -> Starlette:
  server = OpenAIServer(llm, served_model_name, api_key)
  routes = [Route("/v1/chat/completions", server.chat, methods=["POST"]), Route("/v1/models", server.models),
            Route("/health", server.health), Route("/metrics", server.metrics)]
  # a bug's traceback goes to uvicorn's log, never to the client; a client that hangs up mid-upload is no error of ours (499, no traceback)
  not_found = lambda status: "NotFoundError" if status == 404 else "invalid_request_error"
  handlers = {APIError: lambda request, e: e.response(), ClientDisconnect: lambda request, e: Response(status_code=499),
              HTTPException: lambda request, e: APIError(e.detail, e.status_code, not_found(e.status_code), code=e.status_code).response(),
              Exception: lambda request, e: APIError("Internal server error", 500, "InternalServerError", code=500).response()}
  return Starlette(routes=routes, exception_handlers=handlers)

def cli() -> argparse.ArgumentParser:
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
  return parser

def main():
  args = cli().parse_args()
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  # the engine loads the model and captures its graphs before we listen, so the first request pays no JIT cost
  llm = AsyncLLM(Config(**{k: v for k, v in vars(args).items() if k in Config.__dataclass_fields__ and v is not None}))
  log.info("ready on http://%s:%d", args.host, args.port)
  with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the Ctrl-C it handled; the shutdown was clean, so exit 0
    uvicorn.run(build_app(llm, args.served_model_name, args.api_key), host=args.host, port=args.port, timeout_graceful_shutdown=5)

if __name__ == "__main__": main()
