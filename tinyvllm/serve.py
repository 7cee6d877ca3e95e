"""OpenAI-compatible HTTP server (`python -m tinyvllm.serve`): one AsyncLLM behind a small Starlette app, shaped like vLLM's api_server."""
import argparse, asyncio, bisect, collections, contextlib, dataclasses, hmac, itertools, json, logging, time, typing, uuid
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from tinyvllm.config import Config
from tinyvllm.sequence import SamplingParams
from tinyvllm.llm_engine import AsyncLLM

MAX_BODY = 1 << 20
log = logging.getLogger("tinyvllm.serve")
FIELDS = {"model": str, "messages": list, "max_tokens": int, "max_completion_tokens": int, "temperature": (int, float),
          "top_p": (int, float), "top_k": int, "seed": int, "n": int, "stop": (str, list), "stop_token_ids": list, "stream": bool,
          "stream_options": dict, "ignore_eos": bool}
# (name, engine.stats() key, help): vLLM's names and meanings, so its dashboards work; the raw block counts let tests check for leaks
METRICS = [("vllm:num_requests_running", "num_running", "Requests in the running batch."), ("vllm:num_requests_waiting", "num_waiting",
            "Requests waiting to be scheduled."), ("vllm:kv_cache_usage_perc", "kv_cache_usage", "KV-cache usage. 1 means 100 percent usage."),
           ("vllm:prefix_cache_queries_total", "prefix_cache_queries", "Prefix cache queries, in queried tokens."),
           ("vllm:prefix_cache_hits_total", "prefix_cache_hits", "Prefix cache hits, in cached tokens."),
           ("vllm:num_preemptions_total", "num_preemptions", "Cumulative number of preemptions."),
           ("vllm:prompt_tokens_total", "prompt_tokens", "Prefill tokens processed."), ("vllm:generation_tokens_total", "generation_tokens",
            "Generation tokens processed."), ("tinyvllm:num_blocks", "num_blocks", "KV-cache blocks in the pool."),
           ("tinyvllm:num_free_blocks", "num_free_blocks", "KV-cache blocks on the free list (unused or only prefix-cached).")]
SAMPLING = ("n", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "ignore_eos")

class APIError(Exception):
  def __init__(self, message, status=400, type="invalid_request_error", param=None, code=None):
    super().__init__(message); self.status, self.type, self.param, self.code = status, type, param, code
  def response(self): return JSONResponse({"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}, self.status)

class Histogram:
  """A Prometheus histogram: cumulative bucket counts plus sum and count, rendered in the text exposition format."""
  def __init__(self, name, doc, buckets): self.name, self.doc, self.buckets, self.counts, self.sum = name, doc, buckets, [0] * (len(buckets) + 1), 0.0
  def observe(self, v): self.sum += v; self.counts[bisect.bisect_left(self.buckets, v)] += 1   # the first bucket with v <= le
  def render(self, lbl):
    cumulative = zip([*map(str, self.buckets), "+Inf"], itertools.accumulate(self.counts))
    n = self.name
    return [f"# HELP {n} {self.doc}", f"# TYPE {n} histogram", *(f'{n}_bucket{{{lbl},le="{le}"}} {c}' for le, c in cumulative),
            f"{n}_sum{{{lbl}}} {self.sum}", f"{n}_count{{{lbl}}} {sum(self.counts)}"]

class SSEResponse(StreamingResponse):
  # Starlette cancels the body iterator on disconnect but never closes it; closing it here runs the engine's abort deterministically
  async def __call__(self, scope, receive, send):
    try: await super().__call__(scope, receive, send)
    finally: await self.body_iterator.aclose()

def _reject(const): raise ValueError(f"{const} is not valid JSON")

async def _disconnected(request):
  while (await request.receive())["type"] != "http.disconnect": pass

def build_app(llm:AsyncLLM, served_model_name:str|None=None, api_key:str|None=None) -> Starlette:
  cfg, tok, name = llm.engine.config, llm.engine.tokenizer, served_model_name or llm.engine.model_name
  lbl = f"model_name={json.dumps(name, ensure_ascii=False)}"
  # vLLM's bucket edges, so its Grafana dashboards read these histograms unchanged
  hists = [Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", [0.001, 0.005, 0.01, 0.02, 0.04,
             0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]),
           Histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", [0.01, 0.025, 0.05, 0.075, 0.1,
             0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]),
           Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5,
             5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0])]
  successes = collections.Counter()

  def auth(request):  # every /v1 route; /health and /metrics stay open for probes and scrapers
    if api_key and not hmac.compare_digest(request.headers.get("authorization", "").encode(), f"Bearer {api_key}".encode()):
      raise APIError("Incorrect API key provided.", 401, code="invalid_api_key")

  async def parse(request) -> tuple[list[int], SamplingParams, dict]:
    auth(request)
    if (cl := request.headers.get("content-length", "")).isdigit() and int(cl) > MAX_BODY: raise APIError(f"Body over {MAX_BODY} bytes", 413)
    raw = bytearray()
    async for chunk in request.stream():  # chunked uploads carry no Content-Length: count what actually arrives
      if len(raw := raw + chunk) > MAX_BODY: raise APIError(f"Body over {MAX_BODY} bytes", 413)
    try: body = json.loads(raw, parse_constant=_reject)
    except (ValueError, RecursionError) as e: raise APIError(f"Invalid JSON body: {e}")
    if not isinstance(body, dict): raise APIError("The body must be a JSON object")
    for k, t in FIELDS.items():
      v = body.get(k)
      if v is not None and (not isinstance(v, t) or isinstance(v, bool) and t is not bool) or k == "stop" and isinstance(v, list) and \
         not all(isinstance(s, str) for s in v) or k == "stop_token_ids" and v and not all(type(i) is int for i in v):
        raise APIError(f"'{k}' has the wrong type: {v!r}", param=k)
    if body.get("model") not in (None, name): raise APIError(f"The model `{body['model']}` does not exist.", 404, "NotFoundError", "model", 404)
    if not body.get("messages"): raise APIError("'messages' must be a non-empty list", param="messages")
    text = lambda c: isinstance(c, str) or isinstance(c, list) and \
      all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in c)
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) and text(m.get("content")) for m in body["messages"]):
      raise APIError("each message needs a string 'role' and a 'content' that is a string or a list of text parts", param="messages")
    try: prompt = tok.encode_chat(body["messages"])  # the tokenizer joins text parts with newlines, as vLLM does
    except Exception as e: raise APIError(f"Could not render the chat template: {e}", param="messages")
    mt = next((body[k] for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None), None)
    kw, L = {k: body[k] for k in SAMPLING if body.get(k) is not None}, cfg.max_model_len
    try: params = SamplingParams(max_tokens=max(L - len(prompt), 1) if mt is None else mt, **kw)   # default: the rest of the context
    except (ValueError, TypeError) as e: raise APIError(str(e))
    if (total := len(prompt) + params.max_tokens) > L:
      raise APIError(f"This model's maximum context length is {L} tokens. However, you requested {total} tokens ({len(prompt)} in the messages, "
                     f"{params.max_tokens} in the completion). Please reduce the length of the messages or completion.", param="messages")
    if not prompt: raise APIError("The rendered prompt is empty", param="messages")
    if params.n > cfg.max_num_seqs: raise APIError(f"n must be at most max_num_seqs ({cfg.max_num_seqs})", param="n")
    return prompt, params, body

  def account(out, counts):  # per-choice token counts; on the final output, latency histograms
    for o in out.outputs: counts[o.index] += len(o.token_ids)
    if out.finished and (m := out.metrics):
      hists[0].observe(m["first_token_time"] - m["arrival_time"]); hists[2].observe(m["finish_time"] - m["arrival_time"])
      if max(counts) > 1: hists[1].observe((m["finish_time"] - m["first_token_time"]) / (max(counts) - 1))  # the longest choice ends last
      successes[out.outputs[-1].finish_reason] += 1

  async def chat(request):
    prompt, params, body = await parse(request)
    rid, created, counts = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), [0] * params.n
    head = {"id": rid, "object": "chat.completion", "created": created, "model": name}
    usage = lambda: {"prompt_tokens": len(prompt), "completion_tokens": sum(counts), "total_tokens": len(prompt) + sum(counts)}
    choice = lambda i, fr, **kw: {"index": i, **kw, "logprobs": None, "finish_reason": fr}
    sse = lambda choices, **kw: f"data: {json.dumps({**head, 'object': 'chat.completion.chunk', 'choices': choices, **kw})}\n\n"
    if body.get("stream"):
      async def events():
        async with contextlib.aclosing(llm.generate(prompt, params, rid)) as gen:
          yield "".join(sse([choice(i, None, delta={"role": "assistant", "content": ""})]) for i in range(params.n))
          async for out in gen:
            account(out, counts)
            # text can lag tokens (partial UTF-8, held-back stop-string prefixes): only send chunks that carry something
            yield "".join(sse([choice(o.index, o.finish_reason, delta={"content": o.text} if o.text else {})])
                          for o in out.outputs if o.text or o.finish_reason)
          if (body.get("stream_options") or {}).get("include_usage"): yield sse([], usage=usage())
          yield "data: [DONE]\n\n"
      return SSEResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    texts, reasons = [""] * params.n, [None] * params.n
    async def collect():
      async with contextlib.aclosing(llm.generate(prompt, params, rid)) as gen:
        async for out in gen:
          account(out, counts)
          for o in out.outputs: texts[o.index] += o.text; reasons[o.index] = o.finish_reason or reasons[o.index]
    # uvicorn does not cancel a handler whose client left: watch for it, so a dropped request stops using KV blocks
    task, gone = asyncio.ensure_future(collect()), asyncio.ensure_future(_disconnected(request))
    await asyncio.wait([task, gone], return_when=asyncio.FIRST_COMPLETED)
    gone.cancel()
    if not task.done(): task.cancel(); return Response(status_code=499)  # cancelling reaches the engine's generator, which aborts
    task.result()   # re-raises an engine error: the Exception handler turns it into an OpenAI-shaped 500
    return JSONResponse({**head, "choices": [choice(i, reasons[i], message={"role": "assistant", "content": texts[i]}) for i in range(params.n)],
                         "usage": usage()})

  async def models(request):
    auth(request)
    return JSONResponse({"object": "list", "data": [{"id": name, "object": "model", "created": int(time.time()), "owned_by": "tinyvllm",
                                                     "root": cfg.model or name, "max_model_len": cfg.max_model_len}]})

  async def metrics(request):
    s = llm.engine.stats()
    lines = [ln for n, key, doc in METRICS for ln in (f"# HELP {n} {doc}", f"# TYPE {n} {'counter' if n.endswith('_total') else 'gauge'}",
                                                      f"{n}{{{lbl}}} {s[key]}")]
    lines += ["# HELP vllm:request_success_total Count of successfully processed requests.", "# TYPE vllm:request_success_total counter",
              *(f'vllm:request_success_total{{{lbl},finished_reason="{r}"}} {c}' for r, c in successes.items())]
    return Response("\n".join(lines + [ln for h in hists for ln in h.render(lbl)]) + "\n", media_type="text/plain; version=0.0.4")

  def http_error(request, e): return APIError(e.detail, e.status_code, "NotFoundError" if e.status_code == 404 else "invalid_request_error",
                                              code=e.status_code).response()
  def server_error(request, e): return APIError(str(e), 500, "InternalServerError", code=500).response()   # uvicorn logs the traceback
  return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/models", models), Route("/health", lambda r: Response()),
                           Route("/metrics", metrics)], exception_handlers={APIError: lambda r, e: e.response(), HTTPException: http_error,
                                                                            Exception: server_error})

def main():
  p = argparse.ArgumentParser(description="tinyvllm OpenAI-compatible server")
  for f in dataclasses.fields(Config):   # every engine option is a flag: --model, --device, --max-model-len, --kv-cache-memory, ...
    typ = next((t for t in typing.get_args(f.type) if t is not type(None)), f.type)
    p.add_argument("--" + f.name.replace("_", "-"), **({"action": argparse.BooleanOptionalAction} if typ is bool else {"type": typ}))
  p.add_argument("--served-model-name"); p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1/*")
  p.add_argument("--host", default="127.0.0.1"); p.add_argument("--port", type=int, default=8000)
  args = p.parse_args()
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  # the engine picks the device, loads the model and captures its graphs before we listen, so the first request pays no JIT cost
  llm = AsyncLLM(Config(**{k: v for k, v in vars(args).items() if k in Config.__dataclass_fields__ and v is not None}))
  s, c = llm.engine.stats(), llm.engine.config
  log.info("device %s, model %s (%s), max_model_len %d, %d KV blocks of %d tokens (%d tokens)", llm.engine.device, llm.engine.model_name,
           c.model or "bundled", c.max_model_len, s["num_blocks"], c.block_size, s["num_blocks"] * c.block_size)
  log.info("serving on http://%s:%d/v1", args.host, args.port)
  with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the Ctrl-C it handled; the shutdown was clean, so exit 0
    uvicorn.run(build_app(llm, args.served_model_name, args.api_key), host=args.host, port=args.port, timeout_graceful_shutdown=5)

if __name__ == "__main__": main()
