"""The OpenAI-compatible server against a real uvicorn on a free port (CPU, bundled stories260K): the official openai client, raw SSE,
concurrency, error shapes, disconnects (no leaked KV blocks), /metrics, the README snippets and the CLI entry point."""
import asyncio, contextlib, functools, json, logging, os, re, shutil, signal, socket, subprocess, sys, threading, time, types
from concurrent.futures import ThreadPoolExecutor
import httpx, openai, pytest, uvicorn
from hypothesis import HealthCheck, example, given, settings, strategies as st
from tinyvllm.config import Config
from tinyvllm.sequence import SamplingParams
from tinyvllm.llm_engine import AsyncLLM
from tinyvllm.serve import build_app

MODEL, ROOT = "stories260K", os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MSGS = [{"role": "user", "content": "Once upon a time, there was a little girl named Lily."}]
# the README's client examples; test_readme_snippets prefers the README's own copies when it has them
PY_SNIPPET = '''
from openai import OpenAI
client = OpenAI(base_url="http://localhost:8000/v1", api_key="EMPTY")
messages = [{"role": "user", "content": "Once upon a time"}]
resp = client.chat.completions.create(model="stories260K", messages=messages, max_tokens=32)
print(resp.choices[0].message.content, resp.usage)
for chunk in client.chat.completions.create(model="stories260K", messages=messages, max_tokens=32, stream=True):
    print(chunk.choices[0].delta.content or "", end="", flush=True)
'''
CURL_SNIPPET = '''curl http://localhost:8000/v1/chat/completions -H "Content-Type: application/json" \\
  -d '{"model": "stories260K", "messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 32}'
'''

def free_socket():
  s = socket.socket(socket.AF_INET, socket.SOCK_STREAM); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 0))
  return s

@pytest.fixture(scope="module")
def srv():
  llm = AsyncLLM(Config(device="CPU", max_num_seqs=32))
  while llm.engine.runner.pending: time.sleep(0.05)   # every graph in (captured while idle), as the tests below expect
  sock, loop = free_socket(), asyncio.new_event_loop()
  server = uvicorn.Server(uvicorn.Config(build_app(llm), log_level="warning", timeout_graceful_shutdown=2))
  th = threading.Thread(target=lambda: loop.run_until_complete(server.serve(sockets=[sock])), daemon=True); th.start()
  deadline = time.monotonic() + 30
  while not server.started:
    assert time.monotonic() < deadline and th.is_alive(), "server did not start"; time.sleep(0.05)
  url = f"http://127.0.0.1:{sock.getsockname()[1]}"
  yield types.SimpleNamespace(url=url, llm=llm, tok=llm.engine.tokenizer, loop=loop,
                              client=openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=60, max_retries=0))
  server.should_exit = True; th.join(15); sock.close()
  assert not th.is_alive(), "server did not stop"

def engine_generate(srv, prompt_ids, **kw):
  """The same request straight through AsyncLLM, on the server's loop: the reference for token counts and text."""
  async def run():
    ids, text = [], ""
    async for out in srv.llm.generate(prompt_ids, SamplingParams(**kw), f"ref-{time.monotonic_ns()}"):
      for o in out.outputs: ids += o.token_ids; text += o.text
    return ids, text
  return asyncio.run_coroutine_threadsafe(run(), srv.loop).result(60)

def metrics(srv) -> dict[str, float]:
  """Prometheus samples by name plus their labels other than model_name, in label order: 'vllm:x_bucket,le="0.5"' -> value."""
  r = httpx.get(srv.url + "/metrics", timeout=10); assert r.status_code == 200
  samples = {}
  for name, labels, value in re.findall(r'^([\w:]+)\{(.*)\} (\S+)$', r.text, re.M):
    assert re.search(r'(^|,)model_name="[^"]*"', labels), labels
    samples[name + "".join("," + label for label in re.findall(r'\w+="[^"]*"', labels) if not label.startswith("model_name="))] = float(value)
  return samples | {"_text": r.text}

def wait_idle(srv, timeout=60):
  deadline = time.monotonic() + timeout
  while (m := metrics(srv))["vllm:num_requests_running"] or m["vllm:num_requests_waiting"] or \
        m["tinyvllm:num_free_blocks"] != m["tinyvllm:num_blocks"]:
    assert time.monotonic() < deadline, f"engine not idle / blocks leaked: {m}"; time.sleep(0.1)
  return m

def sse(resp) -> list:
  return [line[6:] if line == "data: [DONE]" else json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]

def test_health_models(srv):
  assert httpx.get(srv.url + "/health").status_code == 200
  assert [m.id for m in srv.client.models.list().data] == [MODEL]
  r = httpx.get(srv.url + "/v1/models").json()
  assert r["object"] == "list" and r["data"][0]["max_model_len"] == srv.llm.engine.config.max_model_len

def test_chat(srv):
  prompt = srv.tok.encode_chat(MSGS)
  ref_ids, ref_text = engine_generate(srv, prompt, max_tokens=12, temperature=0)
  r = srv.client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=12, temperature=0)
  assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == MODEL and abs(r.created - time.time()) < 60
  c = r.choices[0]
  assert c.index == 0 and c.message.role == "assistant" and c.message.content == ref_text
  assert srv.tok.hf.decode(ref_ids) == ref_text.lstrip(" ")  # sentencepiece drops a text's leading space out of context
  assert c.finish_reason == ("length" if len(ref_ids) == 12 else "stop")
  assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (len(prompt), len(ref_ids), len(prompt) + len(ref_ids))
  # content parts render like the plain string; ignore_eos runs to max_tokens
  parts = [{"role": "user", "content": [{"type": "text", "text": MSGS[0]["content"]}]}]
  r = srv.client.chat.completions.create(model=MODEL, messages=parts, max_tokens=7, temperature=0, extra_body={"ignore_eos": True})
  assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length"

def test_stream(srv):
  kw = dict(model=MODEL, messages=MSGS, max_tokens=12, temperature=0)
  full = srv.client.chat.completions.create(**kw)
  chunks = list(srv.client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
  assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id and c.model == MODEL for c in chunks)
  assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full.choices[0].message.content
  assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [full.choices[0].finish_reason]
  assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == full.usage.model_dump()

def test_n_above_one_is_refused(srv):
  """n > 1 went to pay for tensor parallelism (README, "Not supported, and why"): a 400 naming n; n: 1 is one choice."""
  r = post(srv, {"messages": MSGS, "max_tokens": 2, "n": 2})
  assert_error(r, 400, "n")
  assert "n must be 1" in r.json()["error"]["message"]
  r = srv.client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=6, n=1, extra_body={"ignore_eos": True})
  assert [c.index for c in r.choices] == [0] and r.usage.completion_tokens == 6

def test_stop(srv):
  kw = dict(model=MODEL, messages=MSGS, max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
  text = srv.client.chat.completions.create(**kw).choices[0].message.content
  stop = text.split()[3]   # a word from the middle: generation must stop right before its first occurrence
  for stream in (False, True):
    if stream: r = "".join(c.choices[0].delta.content or "" for c in srv.client.chat.completions.create(**kw, stop=[stop, "zzz"], stream=True))
    else: c = srv.client.chat.completions.create(**kw, stop=stop).choices[0]; r = c.message.content; assert c.finish_reason == "stop"
    assert stop not in r and r == text[:text.index(stop)]
  # vLLM's stop_reason names the stop string
  r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": MSGS, **kw["extra_body"], "max_tokens": 40, "temperature": 0, "stop": [stop]},
                 timeout=60).json()["choices"][0]
  assert r["message"]["content"] == text[:text.index(stop)] and r["stop_reason"] == stop and r["finish_reason"] == "stop"

def test_seed(srv):
  texts = [srv.client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=16, temperature=1, seed=s).choices[0].message.content
           for s in (7, 7, 8, 9, 10)]
  assert texts[0] == texts[1] and len(set(texts[1:])) > 1

def test_render_gives_the_prompts_token_ids(srv):
  """vLLM's /v1/chat/completions/render (what vllm-router's cache_aware routes by): the chat template's token ids, checked like a chat
  request (a bad field is the same 400), and nothing generated."""
  r = httpx.post(srv.url + "/v1/chat/completions/render", json={"messages": MSGS, "max_tokens": 4}, timeout=30)
  assert r.status_code == 200 and r.json() == {"token_ids": srv.tok.encode_chat(MSGS)}
  assert_error(httpx.post(srv.url + "/v1/chat/completions/render", json={"messages": MSGS, "n": 2}, timeout=30), 400, "n")

def test_raw_sse_order(srv):
  body = {"model": MODEL, "messages": MSGS, "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}
  with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as r:
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    ev = sse(r)
  assert ev[-1] == "[DONE]" and ev.count("[DONE]") == 1
  chunks, usage = ev[:-2], ev[-2]
  assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0 and usage["object"] == "chat.completion.chunk"
  assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
  # role, content deltas, then exactly one finish_reason, last
  mine = [c["choices"][0] for c in chunks]
  assert all(len(c["choices"]) == 1 and c["id"] == usage["id"] and c["choices"][0]["index"] == 0 for c in chunks)
  assert "role" in mine[0]["delta"] and all("role" not in c["delta"] for c in mine[1:])
  assert [c["finish_reason"] is not None for c in mine] == [False] * (len(mine) - 1) + [True]

def test_continuous_usage_stats(srv):
  """vLLM's stream_options: include_usage adds a last chunk with the usage and no choices; continuous_usage_stats with it puts the usage
  so far in every chunk too (the role chunk's counts no completion token), and alone adds nothing. The counts are the engine's own."""
  kw = dict(model=MODEL, messages=MSGS, max_tokens=12, temperature=0)
  prompt, (ref_ids, _) = srv.tok.encode_chat(MSGS), engine_generate(srv, srv.tok.encode_chat(MSGS), max_tokens=12, temperature=0)
  chunks = list(srv.client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}))
  counts = [(c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens) for c in chunks]
  assert counts[0] == (len(prompt), 0, len(prompt)) and counts[-2] == counts[-1] == (len(prompt), len(ref_ids), len(prompt) + len(ref_ids))
  assert [c for _, c, _ in counts] == sorted(c for _, c, _ in counts) and chunks[-1].choices == [] and chunks[-2].choices[0].finish_reason
  for options, last in (({"continuous_usage_stats": True}, False), ({"include_usage": True}, True), ({}, False)):
    chunks = list(srv.client.chat.completions.create(**kw, stream=True, stream_options=options))
    assert [c.usage is not None for c in chunks] == [False] * (len(chunks) - last) + [True] * last, options
  # stream_options needs stream true only when it says something: {} and null pass, as in vLLM; so does tool_choice none without tools
  for body in ({"stream_options": {}}, {"stream_options": None, "tool_choice": None}, {"tool_choice": "none"}):
    assert post(srv, {"messages": MSGS, "max_tokens": 2, **body}).status_code == 200, body

def test_concurrent_matches_sequential(srv):
  prompts = [[{"role": "user", "content": f"{w} day, {i} little {a} went to the park."}]
             for i, (w, a) in enumerate((w, a) for w in ("One", "Every", "The next", "Some") for a in ("dogs", "cats", "birds", "kids", "frogs",
                                                                                                    "bears", "girls", "boys"))]
  kw = dict(model=MODEL, max_tokens=16, temperature=0)
  seq = [srv.client.chat.completions.create(messages=p, **kw).choices[0].message.content for p in prompts]
  async def main():
    client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", timeout=120, max_retries=0)
    async def one(p):
      return "".join([c.choices[0].delta.content or "" async for c in await client.chat.completions.create(messages=p, stream=True, **kw)])
    try: return await asyncio.gather(*map(one, prompts))
    finally: await client.close()
  assert asyncio.run(main()) == seq and len(set(seq)) > 1
  wait_idle(srv)

BAD = [  # (body or raw bytes, status, param)
  (b"{not json", 400, None), (b"[1, 2]", 400, None), (b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400, None),
  (b'{"model": "stories260K"}', 400, "messages"), ({"messages": None}, 400, "messages"), ({"messages": []}, 400, "messages"),
  ({"messages": "hi"}, 400, "messages"), ({"messages": ["hi"]}, 400, "messages"),
  ({"messages": [{"role": "user", "content": 5}]}, 400, "messages"), ({"messages": [{"content": "x"}]}, 400, "messages"),
  ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "messages"),
  ({"messages": [{"role": "user", "content": "\ud800"}]}, 400, "messages"),   # a lone surrogate: the tokenizer's C++ refuses it
  # content is a string, null or text parts, checked before anything copies it: 5,000 levels once overflowed copy.deepcopy (a 500)
  (b'{"messages": [{"role": "user", "content": ' + b"[" * 5000 + b"]" * 5000 + b'}], "max_tokens": 2}', 400, "messages"),
  ({"messages": [{"role": "user", "content": {"type": "text", "text": "x"}}]}, 400, "messages"),
  ({"messages": [{"role": "user", "content": [["x"]]}]}, 400, "messages"), ({"messages": [{"role": "user", "content": [5]}]}, 400, "messages"),
  ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, 400, "messages"),
  (b"[" * 50_000 + b"]" * 50_000, 400, None),   # too deep for json.loads itself
  ({"temperature": "hot"}, 400, "temperature"), ({"max_tokens": "10"}, 400, "max_tokens"), ({"n": True}, 400, "n"), ({"stop": 5}, 400, "stop"),
  ({"stop": ["a", 1]}, 400, "stop"), ({"stop_token_ids": [1.5]}, 400, "stop_token_ids"), ({"stop_token_ids": [2]}, 400, "stop_token_ids"),
  ({"include_stop_str_in_output": True}, 400, "include_stop_str_in_output"), ({"stream": "yes"}, 400, "stream"),
  ({"temperature": -1}, 400, "temperature"), ({"top_p": 0}, 400, "top_p"), ({"top_p": 1.5}, 400, "top_p"), ({"top_k": -3}, 400, "top_k"),
  ({"min_p": 1.5}, 400, "min_p"), ({"min_p": -0.1}, 400, "min_p"), ({"min_p": "0.1"}, 400, "min_p"),
  ({"n": 0}, 400, "n"), ({"max_tokens": 0}, 400, "max_tokens"), ({"max_completion_tokens": 0}, 400, "max_completion_tokens"),
  ({"stop": [""]}, 400, "stop"), ({"n": 10**6}, 400, "n"), ({"max_tokens": 10**9}, 400, "messages"),
  ({"messages": [{"role": "user", "content": "Once upon a time " * 200}]}, 400, "messages"),
  ({"model": "gpt-4"}, 404, "model"), ({"model": "gpt-4", "stream": True}, 404, "model"),
  # vLLM's validators (ChatCompletionRequest): tools: [] is refused (OpenAI's rule too), tool_choice other than none needs tools ({} is none
  # of its forms), stream_options needs stream true
  ({"tools": []}, 400, "tools"), ({"tools": [], "tool_choice": "none"}, 400, "tools"), ({"tool_choice": "auto"}, 400, "tool_choice"),
  ({"tool_choice": "required"}, 400, "tool_choice"), ({"tool_choice": {}}, 400, "tool_choice"),
  ({"stream_options": {"include_usage": True}}, 400, "stream_options"), ({"stream_options": {"include_usage": True}, "stream": False}, 400, "stream_options"),
]

@pytest.mark.parametrize("body,status,param", BAD, ids=[str(b)[:60] for b, *_ in BAD])
def test_errors(srv, body, status, param):
  if isinstance(body, dict): body = json.dumps({"messages": MSGS, "max_tokens": 2, **body}).encode()
  r = httpx.post(srv.url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=30)
  err = r.json()["error"]
  assert r.status_code == status and set(err) == {"message", "type", "param", "code"} and err["message"] and err["param"] == param
  assert err["type"] == ("NotFoundError" if status == 404 else "invalid_request_error") and (status != 404 or err["code"] == 404)
  if b"10000000" in body: assert "maximum context length is 512 tokens" in err["message"] and "in the completion" in err["message"]
  # the message is written for the client: never the whole SamplingParams, nor a library's C++ or pybind text
  assert not re.search(r"SamplingParams\(|C\+\+|pybind|Traceback", err["message"]), err["message"]
  assert srv.client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2).choices[0].message.content is not None

@pytest.mark.parametrize("kw", [dict(top_k=10**12), dict(temperature=1e300), dict(temperature=1e-300), dict(top_p=1e-300, top_k=0),
                                dict(seed=2**63 - 1), dict(seed=-5), dict(stop_token_ids=[]), dict(max_tokens=None, stop=["."]),
                                dict(max_completion_tokens=3, max_tokens=10**9), dict(temperature=0, top_p=0.5, top_k=3),
                                dict(min_p=1), dict(min_p=0.5, top_p=0.5, top_k=5, temperature=1.5)])
@pytest.mark.filterwarnings("ignore:overflow encountered in cast")   # temperature 1e300 is inf in float32: uniform sampling
def test_extreme_but_valid(srv, kw):   # accepted values that must neither fail nor upset the engine
  r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": MSGS, "max_tokens": 3, **kw}, timeout=60)
  assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text

def test_errors_http(srv):
  big = b'{"messages": "' + b"x" * (1 << 20) + b'"}'
  r = httpx.post(srv.url + "/v1/chat/completions", content=big, timeout=30)   # with Content-Length
  assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"
  r = httpx.post(srv.url + "/v1/chat/completions", content=iter([big[i:i + 65536] for i in range(0, len(big), 65536)]), timeout=30)  # chunked
  assert r.status_code == 413 and r.request.headers.get("transfer-encoding") == "chunked"
  assert httpx.get(srv.url + "/v1/chat/completions").status_code == 405
  r = httpx.get(srv.url + "/v1/nothing"); assert r.status_code == 404 and r.json()["error"]["code"] == 404
  with pytest.raises(openai.NotFoundError): srv.client.chat.completions.create(model="nope", messages=MSGS, max_tokens=2)
  with pytest.raises(openai.BadRequestError, match="maximum context length"):
    srv.client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=10**5)
  assert srv.client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2).usage.completion_tokens >= 1

def test_disconnect_frees_blocks(srv):
  before, n = wait_idle(srv), srv.llm.engine.config.max_model_len - len(srv.tok.encode_chat(MSGS))
  body = {"model": MODEL, "messages": MSGS, "max_tokens": n, "ignore_eos": True, "stream": True}
  for _ in range(4):   # streaming clients that read a few events, then hang up
    with httpx.Client(timeout=60) as c, c.stream("POST", srv.url + "/v1/chat/completions", json=body) as r:
      for i, _ in enumerate(r.iter_lines()):
        if i >= 4: break
  with pytest.raises(httpx.TimeoutException):   # a non-streaming client that gives up
    httpx.post(srv.url + "/v1/chat/completions", json={**body, "stream": False}, timeout=0.5)
  after = wait_idle(srv)   # no request left running and every KV block back on the free list
  # a dropped request that ran to completion would have generated n tokens
  assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 5 * n / 2, "a dropped request was not aborted"

def test_metrics(srv):
  for _ in range(2): srv.client.chat.completions.create(model=MODEL, messages=MSGS * 4, max_tokens=4)   # the second hits the prefix cache
  m, text = metrics(srv), metrics(srv)["_text"]
  for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
               "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
    assert name in m and f"# TYPE {name} {'counter' if name.endswith('_total') else 'gauge'}" in text
  assert m["vllm:prompt_tokens_total"] > 0 and m["vllm:generation_tokens_total"] > 0 and m["vllm:prefix_cache_hits_total"] > 0
  assert 0 <= m["vllm:kv_cache_usage_perc"] <= 1
  # the latency histograms and the success counter went to pay for tensor parallelism (README, "Not supported, and why")
  assert "histogram" not in text and "vllm:request_success" not in text

# ---- issue #13: no request can hurt another -------------------------------------------------------------------------------------------------

def post(srv, body, **kw) -> httpx.Response:
  return httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60, **kw)

def chat_text(srv, messages, **kw) -> str:
  return srv.client.chat.completions.create(model=MODEL, messages=messages, **kw).choices[0].message.content

def streamed_text(events) -> str:
  return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if isinstance(e, dict) and e.get("choices"))

def stream_events(srv, body) -> list:
  with httpx.stream("POST", srv.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r: return sse(r)

@contextlib.contextmanager
def stream_in_flight(srv, body):
  """A stream that is running (its first content arrived) while the block runs; yields a future of all its events."""
  first, events = threading.Event(), []
  def read():
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
      for line in r.iter_lines():
        if line.startswith("data: "): events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
        if streamed_text(events[-1:]): first.set()
    first.set()
    return events
  with ThreadPoolExecutor(1) as pool:
    future = pool.submit(read)
    assert first.wait(60), "the stream did not start"
    yield future

def assert_error(r:httpx.Response, status:int, param:str|None):
  err = r.json()["error"]
  assert r.status_code == status and set(err) == {"message", "type", "param", "code"} and err["param"] == param, r.text

NUMBERS = [("temperature", 10**309), ("temperature", -10**309), ("temperature", -0.5), ("temperature", "0.5"), ("temperature", True),
           ("top_p", 0), ("top_p", 1.5), ("top_p", 10**309), ("top_k", -2), ("top_k", 2.5), ("top_k", 10**309), ("top_k", 2**63), ("min_p", 10**309),
           ("max_tokens", 0), ("max_tokens", 1.5), ("max_tokens", 10**309), ("max_completion_tokens", -1), ("seed", 2**63),
           ("seed", -2**63 - 1), ("seed", 1.5), ("seed", 10**309), ("n", 0), ("n", 2.0), ("n", False), ("n", 10**309)]

def test_numbers_are_checked_before_the_engine(srv):
  """Every numeric field is checked for its JSON type, finiteness and vLLM's range: a bad one is a 400 naming it, and the running requests
  never notice. 10**309 is valid JSON that overflows a float: it used to fail the engine step, and with it every request in flight."""
  body = {"messages": MSGS, "max_tokens": 200, "temperature": 0, "ignore_eos": True}
  alone = streamed_text(stream_events(srv, body))
  with stream_in_flight(srv, body) as running:
    for field, value in NUMBERS:
      r = post(srv, {"messages": MSGS, "max_tokens": 2, field: value})
      assert_error(r, 400, field)
  assert streamed_text(running.result()) == alone and running.result()[-1] == "[DONE]"

def test_stop_strings_are_limited(srv):
  """A stop list is at most MAX_STOP_STRINGS strings of at most MAX_STOP_LEN characters: 10,000 of them used to stall every request."""
  from tinyvllm.sequence import MAX_STOP_LEN, MAX_STOP_STRINGS
  for stop in (["x"] * 10_000, ["z"] * (MAX_STOP_STRINGS + 1), ["y" * (MAX_STOP_LEN + 1)]):
    assert_error(post(srv, {"messages": MSGS, "max_tokens": 2, "stop": stop}), 400, "stop")
  at_the_limits = [f"{i:03d}" + "q" * (MAX_STOP_LEN - 3) for i in range(MAX_STOP_STRINGS)]
  assert post(srv, {"messages": MSGS, "max_tokens": 4, "stop": at_the_limits}).status_code == 200

def test_running_metric_counts_requests(srv):
  """vllm:num_requests_running counts the running requests: one while one streams, none after."""
  wait_idle(srv)
  longest = srv.llm.engine.config.max_model_len - len(srv.tok.encode_chat(MSGS))
  with stream_in_flight(srv, {"messages": MSGS, "max_tokens": longest, "ignore_eos": True}) as running:
    assert metrics(srv)["vllm:num_requests_running"] == 1 and not running.done()
  wait_idle(srv)

@contextlib.contextmanager
def failing_step(srv, messages):
  """Fault injection into the real engine: the first step whose batch holds this prompt waits for `release`, then raises as a driver
  would. Requests sent while it waits are not in that step."""
  marked, run = srv.tok.encode_chat(messages), srv.llm.engine.runner.prepare
  fault = types.SimpleNamespace(hit=threading.Event(), release=threading.Event())
  def run_or_fail(batch, *args, **kw):
    if not fault.hit.is_set() and any(seq.prompt_token_ids == marked for seq, _ in batch):
      fault.hit.set(); fault.release.wait(30)
      raise RuntimeError("CUDA error: an illegal memory access was encountered (C++ frame 0xdeadbeef)")
    return run(batch, *args, **kw)
  srv.llm.engine.runner.prepare = run_or_fail
  try: yield fault
  finally: fault.release.set(); srv.llm.engine.runner.prepare = run

def test_a_failing_step_fails_only_its_requests(srv):
  """An exception inside an engine step fails the requests in that step: a stream gets an OpenAI-shaped error event, then [DONE]; a
  non-streaming request a JSON 500. Neither shows the raw exception. Requests outside that step finish with their normal text, and the
  server keeps serving."""
  bystanders = [[{"role": "user", "content": f"The {animal} ran home."}] for animal in ("dog", "cat")]
  alone = [chat_text(srv, m, max_tokens=12, temperature=0) for m in bystanders]
  for stream in (True, False):
    victim = [{"role": "user", "content": f"This one meets a broken GPU (stream={stream})."}]
    wait_idle(srv)
    with failing_step(srv, victim) as fault, ThreadPoolExecutor(3) as pool:
      failed = pool.submit(post, srv, {"messages": victim, "max_tokens": 12, "stream": stream})
      assert fault.hit.wait(30)
      streamed = pool.submit(lambda: streamed_text(stream_events(srv, {"messages": bystanders[0], "max_tokens": 12, "temperature": 0})))
      plain = pool.submit(chat_text, srv, bystanders[1], max_tokens=12, temperature=0)
      time.sleep(0.5)   # the bystanders reach the engine's inbox while the failing step holds the engine thread
      fault.release.set()
      r = failed.result()
      assert [streamed.result(), plain.result()] == alone
    if stream:
      events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
      assert r.status_code == 200 and events[-1] == "[DONE]"
      r = httpx.Response(500, content=events[-2])   # the event before [DONE] is the error body
    assert_error(r, 500, None)
    assert r.json()["error"]["code"] == 500 and not re.search("CUDA|C\\+\\+|0xdeadbeef|Traceback", r.text)
  assert httpx.get(srv.url + "/health").status_code == 200 and chat_text(srv, bystanders[0], max_tokens=12, temperature=0) == alone[0]
  wait_idle(srv)

def test_health_says_503_when_the_engine_cannot_recover(srv):
  """When even an empty step fails after a fault, the engine cannot recover: /health is 503, and new requests get a 503 at once."""
  run = srv.llm.engine.runner.prepare
  def broken(*args, **kw): raise RuntimeError("device lost")
  srv.llm.engine.runner.prepare = broken
  try:
    assert_error(post(srv, {"messages": MSGS, "max_tokens": 2}), 500, None)
    assert httpx.get(srv.url + "/health").status_code == 503
    assert_error(post(srv, {"messages": MSGS, "max_tokens": 2}), 503, None)
  finally: srv.llm.engine.runner.prepare, srv.llm.healthy = run, True   # the fault was ours: lift it
  assert httpx.get(srv.url + "/health").status_code == 200 and chat_text(srv, MSGS, max_tokens=2)

def test_parsing_and_tokenizing_run_off_the_event_loop(srv):
  """JSON parsing, chat templating and tokenizing run in a worker thread: while one large prompt is being tokenized (here held up on
  purpose), other streams start and finish."""
  large = [{"role": "user", "content": "Once upon a time there was a very long story. " * 20_000}]   # ~940 KB
  started, release, encode_chat = threading.Event(), threading.Event(), srv.tok.encode_chat
  def slow_encode_chat(messages):
    if messages == large: started.set(); release.wait(20)
    return encode_chat(messages)
  srv.tok.encode_chat = slow_encode_chat
  try:
    with ThreadPoolExecutor(1) as pool:
      big = pool.submit(post, srv, {"messages": large, "max_tokens": 2})
      assert started.wait(30)
      client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", timeout=10, max_retries=0)
      chunks = list(client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=8, temperature=0, stream=True))
      assert chunks[-1].choices[0].finish_reason and not big.done()
      release.set()
      assert_error(big.result(), 400, "messages")   # longer than the context
  finally: release.set(); srv.tok.encode_chat = encode_chat

def test_body_content_type_and_size(srv):
  """The body is JSON sent as application/json (415 otherwise; no Content-Type is read as JSON), a JSON object (400), at most 1 MB (413)."""
  body = json.dumps({"messages": MSGS, "max_tokens": 2})
  for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
    assert_error(httpx.post(srv.url + "/v1/chat/completions", content=body, headers={"content-type": content_type}), 415, None)
  for content_type in ("application/json", "Application/JSON; charset=utf-8", None):
    headers = {"content-type": content_type} if content_type else {}
    assert httpx.post(srv.url + "/v1/chat/completions", content=body, headers=headers, timeout=60).status_code == 200
  for not_an_object in ("[]", '"hi"', "3", "null"):
    assert_error(httpx.post(srv.url + "/v1/chat/completions", content=not_an_object, headers={"content-type": "application/json"}), 400, None)

def nest(levels:int):   # a JSON value `levels` deep, the innermost value counted: [[0]] is nest(3)
  return functools.reduce(lambda inner, _: [inner], range(levels - 1), 0)

def post_raw(srv, body:bytes) -> httpx.Response:   # for bodies too deep for json.dumps to write
  return httpx.post(srv.url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=30)

def test_fields_are_bounded_in_depth_and_size(srv):
  """Every field nests at most 32 levels and holds at most 65,536 values, far more than tools' JSON schemas need: past either bound it
  is a 400 naming the field, found before anything copies, renders or compiles it, and the server carries on. Tool-call arguments sent
  as JSON text are bounded once parsed, and a 400 too when so deep that json.loads gives up."""
  tools = lambda parameters: {"tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}], "tool_choice": "none"}
  called = lambda arguments: {"messages": MSGS + [  # levels: messages, message, tool_calls, call, function, then the arguments
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "2"}]}
  at_the_bounds = [{"chat_template_kwargs": {"x": nest(31)}}, {"chat_template_kwargs": {"x": [0] * 65_534}}, tools({"x": nest(28)}),
                   called({"x": nest(26)}), called(json.dumps({"x": nest(31)}))]
  past_them = [({"chat_template_kwargs": {"x": nest(32)}}, "chat_template_kwargs"),
               ({"chat_template_kwargs": {"x": [0] * 65_535}}, "chat_template_kwargs"),
               (tools({"x": nest(29)}), "tools"), (tools({"enum": list(range(70_000))}), "tools"),
               (called({"x": nest(27)}), "messages"), (called(json.dumps({"x": nest(32)})), "messages"),
               (called('{"x": ' + "[" * 5000 + "]" * 5000 + "}"), "messages"), (called('{"x": ' + "[" * 50_000 + "]" * 50_000 + "}"), "messages"),
               ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": nest(40)}}}, "response_format")]
  for body in at_the_bounds:
    r = post(srv, {"messages": MSGS, **body, "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text[:300]
  for body, param in past_them:
    r = post(srv, {"messages": MSGS, **body, "max_tokens": 2})
    assert_error(r, 400, param)
    assert chat_text(srv, MSGS, max_tokens=2) is not None   # the server carries on
  # 5,000 levels: a dict of arguments once overflowed copy.deepcopy (a 500); tools and chat_template_kwargs are bounded the same way
  deep = b"[" * 5000 + b"]" * 5000
  calls = b'[{"id": "c", "type": "function", "function": {"name": "f", "arguments": {"x": %s}}}]' % deep
  for body, param in [(b'{"messages": [{"role": "assistant", "content": null, "tool_calls": %s}]}' % calls, "messages"),
                      (b'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": '
                       b'{"name": "f", "parameters": {"x": %s}}}], "tool_choice": "none"}' % deep, "tools"),
                      (b'{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"x": %s}}' % deep, "chat_template_kwargs")]:
    r = post_raw(srv, body)
    assert_error(r, 400, param)
    assert "nests over 32 levels or holds over 65536 values" in r.json()["error"]["message"]
    assert chat_text(srv, MSGS, max_tokens=2) is not None
  wait_idle(srv)

def test_disconnects_leave_no_traceback(srv, caplog):
  """Clients that hang up mid-upload, mid-stream or while waiting for a reply are routine: nothing is logged as an error."""
  uvicorn_log = logging.getLogger("uvicorn.error")   # uvicorn's loggers do not propagate to the root logger that caplog watches
  uvicorn_log.addHandler(caplog.handler)
  port, body = int(srv.url.rsplit(":", 1)[1]), json.dumps({"messages": MSGS, "max_tokens": 50}).encode()
  try:
    with socket.create_connection(("127.0.0.1", port)) as s:   # half a body, then gone
      s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n" + body[:20])
      time.sleep(0.5)
    for stream in (False, True):   # a whole request, then gone before the reply
      with socket.create_connection(("127.0.0.1", port)) as s:
        data = json.dumps({"messages": MSGS, "max_tokens": 50, "stream": stream}).encode()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json={"messages": MSGS, "max_tokens": 200, "ignore_eos": True, "stream": True},
                      timeout=60) as r:   # a stream read a little, then gone
      next(r.iter_lines())
    time.sleep(0.5)
    wait_idle(srv)
  finally: uvicorn_log.removeHandler(caplog.handler)
  assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text

UNSUPPORTED = {  # OpenAI's and vLLM's fields that tinyvllm does not implement yet, each with a value that would change the output
  "presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.2,
  "logit_bias": {"5": 10}, "min_tokens": 3, "functions": [{"name": "f"}], "function_call": {"name": "f"},
  "audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"], "prediction": {"type": "content", "content": "x"},
  "reasoning_effort": "high", "web_search_options": {}, "service_tier": "flex", "store": True, "metadata": {"k": "v"}, "best_of": 2,
  "use_beam_search": True, "echo": True, "guided_json": {"type": "object"}, "chat_template": "{{ x }}", "add_generation_prompt": False,
  "continue_final_message": True,
  "skip_special_tokens": False, "prompt_logprobs": 1, "allowed_token_ids": [1, 2], "bad_words": ["x"],
  "logprobs": True, "top_logprobs": 3,   # logprobs and top_logprobs: traded for tensor parallelism (README, "Not supported, and why")
  "stop_token_ids": [2], "include_stop_str_in_output": True}   # traded for async scheduling (issue #62)
NO_OPS = {  # what real clients send by default: the same fields with values that change nothing (not tools: [], which vLLM refuses)
  "logprobs": False, "top_logprobs": 0, "response_format": {"type": "text"}, "tool_choice": "none", "parallel_tool_calls": True,
  "presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1, "logit_bias": {}, "min_p": 0, "min_tokens": 0, "best_of": 1,
  "skip_special_tokens": True, "add_generation_prompt": True, "echo": False, "store": False, "modalities": ["text"], "service_tier": "auto",
  "user": "alice", "n": 1, "stream": False, "stream_options": None, "stop_token_ids": [], "include_stop_str_in_output": False}

def test_every_field_is_honoured_or_rejected(srv, caplog):
  """No field is silently ignored: one not implemented yet is a 400 naming it, unless null or the default that changes nothing (real
  clients send those); a field outside OpenAI's and vLLM's schema is ignored with a warning in the log, as vLLM does."""
  base = {"messages": MSGS, "max_tokens": 2}
  for field, value in UNSUPPORTED.items():
    r = post(srv, {**base, field: value})
    assert_error(r, 400, field)
    assert field in r.json()["error"]["message"]
  assert_error(post(srv, {**base, "parallel_tool_calls": "false"}), 400, "parallel_tool_calls")   # honoured, and a boolean
  reference = post(srv, {**base, "temperature": 0}).json()["choices"][0]["message"]["content"]
  # defaults, null for everything, and parallel_tool_calls false without tools
  for extra in (NO_OPS, dict.fromkeys(UNSUPPORTED), {"parallel_tool_calls": False}):
    r = post(srv, {**base, "temperature": 0, **extra})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == reference, r.text
  with caplog.at_level(logging.WARNING, logger="tinyvllm.serve"):
    assert post(srv, {**base, "frobnicate": 1}).status_code == 200
  assert "frobnicate" in caplog.text

# ---- fuzzing: whatever the body, a 2xx or a 4xx with an OpenAI error body, and the running streams never notice -----------------------

FUZZ_FIELDS = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "n", "stop", "stop_token_ids",
               "stream", "stream_options", "ignore_eos", "include_stop_str_in_output", "user", "logprobs", "top_logprobs", "tools", "tool_choice",
               "response_format", "presence_penalty", "frequency_penalty", "logit_bias", "min_p", "best_of", "chat_template", "frobnicate", ""]
EXTREMES = st.sampled_from([10**309, -10**309, 2**63, 2**64, -2**63 - 1, 1e308, -1e308, 5e-324, float("nan"), float("inf"), -float("inf")])
LEAVES = st.none() | st.booleans() | st.integers(-3, 3) | EXTREMES | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=10)
JSON_VALUES = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
PLAUSIBLE = st.integers(0, 40) | st.floats(0, 1.5) | st.booleans() | st.lists(st.text(min_size=1, max_size=3), max_size=3)
HUGE_VALUES = st.sampled_from([["stop"] * 20_000, list(range(50_000)), "x" * 300_000, [{"role": "user", "content": "hi"}] * 5_000])
MESSAGES = st.just(MSGS) | st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]) | JSON_VALUES,
                                                           "content": st.text(max_size=40) | JSON_VALUES}), min_size=1, max_size=3)
JSON_BODIES = st.builds(lambda messages, fields: json.dumps({"messages": messages, "max_tokens": 2, "max_completion_tokens": 2, **fields}).encode(),
                        MESSAGES, st.dictionaries(st.sampled_from(FUZZ_FIELDS), JSON_VALUES | PLAUSIBLE | PLAUSIBLE | HUGE_VALUES, max_size=3))
RAW_BODIES = st.binary(max_size=64) | st.sampled_from([b"", b"{", b"null", b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe{}",
                                                       b'{"messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
                                                       b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 1e999}'])
CONTENT_TYPES = st.sampled_from(["application/json"] * 12 + ["application/json; charset=utf-8", None, "text/plain", "application/x-www-form-urlencoded", ""])

def assert_well_formed(r:httpx.Response):
  """A 2xx with a completion or a finished stream, or a 4xx with OpenAI's error body; never a 5xx."""
  assert r.status_code < 500, (r.status_code, r.text[:300])
  if r.status_code >= 400:
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str), r.text[:300]
  elif r.headers["content-type"].startswith("text/event-stream"):
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert r.status_code == 200 and events[-1] == "[DONE]" and not any('"error"' in e[:10] for e in events), r.text[-300:]
  else: assert r.status_code == 200 and r.json()["object"] == "chat.completion", r.text[:300]

def test_fuzzed_bodies_get_a_4xx_and_hurt_no_one(srv):
  """Bodies with wrong types, huge numbers, NaN, huge lists, deep nesting, unknown fields and wrong content types: every response is a 2xx
  or a 4xx with an OpenAI error body, never a 5xx, and the streams opened before the fuzzing finish with the same text as when run alone."""
  longest = srv.llm.engine.config.max_model_len - len(srv.tok.encode_chat(MSGS))
  steady = [{"messages": MSGS, "max_tokens": longest, "temperature": 0, "ignore_eos": True},
            {"messages": MSGS, "max_tokens": longest, "temperature": 0.8, "top_p": 0.9, "top_k": 20, "seed": 5, "ignore_eos": True}]
  alone = [streamed_text(stream_events(srv, body)) for body in steady]
  client = httpx.Client(base_url=srv.url, timeout=60)

  @settings(max_examples=80, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
  @given(body=st.one_of(JSON_BODIES, JSON_BODIES, JSON_BODIES, RAW_BODIES), content_type=CONTENT_TYPES)
  @example(body=json.dumps({"messages": MSGS, "max_tokens": 2, "temperature": 10**309}).encode(), content_type="application/json")
  @example(body=json.dumps({"messages": MSGS, "max_tokens": 2, "top_k": 2**63}).encode(), content_type="application/json")
  @example(body=json.dumps({"messages": MSGS, "max_tokens": 2, "stop": ["x"] * 10_000}).encode(), content_type="application/json")
  def fuzz(body, content_type):
    assert_well_formed(client.post("/v1/chat/completions", content=body, headers={"content-type": content_type} if content_type is not None else {}))

  with contextlib.ExitStack() as stack:
    running = [stack.enter_context(stream_in_flight(srv, body)) for body in steady]
    try: fuzz()
    finally: client.close()
  assert [streamed_text(stream.result()) for stream in running] == alone
  wait_idle(srv)

def readme_blocks(lang, keep):
  readme = open(os.path.join(ROOT, "README.md")).read() if os.path.exists(os.path.join(ROOT, "README.md")) else ""
  return [b for b in re.findall(rf"```{lang}\n(.*?)```", readme, re.S) if keep(b)]

def test_readme_snippets(srv, capsys):
  for snippet in readme_blocks("python", lambda b: "OpenAI(" in b and "localhost:8000/v1" in b) or [PY_SNIPPET]:
    exec(compile(snippet.replace("localhost:8000", srv.url.split("//")[1]), "README", "exec"), {})
    assert len(capsys.readouterr().out.strip()) > 10
  if shutil.which("curl"):
    for snippet in readme_blocks("(?:bash|sh|shell)", lambda b: b.startswith("curl ") and "localhost:8000" in b) or [CURL_SNIPPET]:
      out = subprocess.run(["bash", "-c", snippet.replace("localhost:8000", srv.url.split("//")[1])], capture_output=True, text=True, timeout=60)
      assert out.returncode == 0 and json.loads(out.stdout)["object"] == "chat.completion", out

def test_cli():
  """`python -m tinyvllm.serve` end to end: flags, startup log, --api-key on /v1 only (any case of the Bearer scheme), --served-model-name
  (the only name /v1/models shows: never the model folder's path), a clean SIGTERM to its whole process group (what `timeout` and systemd's
  stop send; tinygrad's compile workers get it too): exit 0 within seconds, no leak report."""
  with free_socket() as s: port = s.getsockname()[1]
  model_dir = os.path.join(ROOT, "tinyvllm", "stories260K")
  cmd = [sys.executable, "-m", "tinyvllm.serve", "--device", "CPU", "--port", str(port), "--api-key", "sk-test", "--served-model-name", "tiny",
         "--max-num-seqs", "2", "--max-model-len", "128", "--enforce-eager", "--model", model_dir]
  p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
  url, log = f"http://127.0.0.1:{port}", []
  threading.Thread(target=lambda: log.extend(p.stdout), daemon=True).start()
  try:
    deadline = time.monotonic() + 120
    while True:
      assert p.poll() is None and time.monotonic() < deadline, "".join(log)
      try:
        if httpx.get(url + "/health", timeout=1).status_code == 200: break
      except httpx.TransportError: time.sleep(0.2)
    assert httpx.get(url + "/metrics").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sk-test"}, {"Authorization": "Basic sk-test"}):
      r = httpx.get(url + "/v1/models", headers=headers)
      assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    for scheme in ("Bearer", "bearer", "BEARER"):
      r = httpx.get(url + "/v1/models", headers={"Authorization": f"{scheme} sk-test"})
      assert r.status_code == 200 and r.json()["data"][0]["id"] == r.json()["data"][0]["root"] == "tiny" and model_dir not in r.text
    with pytest.raises(openai.AuthenticationError):
      openai.OpenAI(base_url=url + "/v1", api_key="nope", max_retries=0).chat.completions.create(model="tiny", messages=MSGS, max_tokens=2)
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-test", timeout=60, max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=3).usage.completion_tokens >= 1
    with pytest.raises(openai.BadRequestError, match="maximum context length is 128"):
      client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=200)
    with pytest.raises(openai.NotFoundError): client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2)
    assert f"ready on http://127.0.0.1:{port}" in "".join(log)
  finally:
    os.killpg(p.pid, signal.SIGTERM)
    try: p.wait(30)
    except subprocess.TimeoutExpired: p.kill(); raise
  assert p.returncode == 0 and "Traceback" not in "".join(log) and "leaked semaphore" not in "".join(log), "".join(log)

def test_cli_help():
  """--help describes every flag."""
  out = subprocess.run([sys.executable, "-m", "tinyvllm.serve", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
  options = re.split(r"\n  (?=-)", out.split("options:", 1)[1])[1:]   # one entry per flag: its spelling, then its description
  assert len(options) > 15
  for option in options:
    assert re.match(r"-[-\w]+(?: [A-Z_]+)?(?:, -[-\w]+(?: [A-Z_]+)?)*(?: {2,}|\s*\n\s+)\S", option), f"no description: {option!r}"
