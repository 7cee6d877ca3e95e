"""Two `tinyvllm.serve` replicas of the bundled model behind vLLM's own router (`vllm-router`, the test extra), started by
scripts/serve_replicas.py and driven by the official openai client: what reaches each replica is read from the replica's own /metrics.
Loopback only; every wait is bounded, and every process started here is stopped at the end, also when a test fails."""
import os, random, re, signal, socket, subprocess, sys, threading, time, types
from concurrent.futures import ThreadPoolExecutor
import httpx, openai, pytest
from test_server import MODEL, MSGS, ROOT, free_socket, metrics

def free_base_port(count:int) -> int:   # `count` consecutive free ports on 127.0.0.1: the replicas listen on base + i
  for _ in range(100):
    base, socks = random.randrange(20000, 60000), []
    try:
      for i in range(count): socks.append(s := socket.socket()); s.bind(("127.0.0.1", base + i))
      return base
    except OSError: pass
    finally: [s.close() for s in socks]
  raise RuntimeError("no free ports")

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
  logs, base = tmp_path_factory.mktemp("router-logs"), free_base_port(2)
  with free_socket() as a, free_socket() as b: port, prometheus = a.getsockname()[1], b.getsockname()[1]
  cmd = [sys.executable, os.path.join(ROOT, "scripts", "serve_replicas.py"), "--replicas", "2", "--base-port", str(base), "--port", str(port),
         "--router-args", f"--prometheus-port {prometheus}", "--log-dir", str(logs), "--startup-timeout", "240", "--device", "CPU"]
  proc, out = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True), []
  threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True).start()
  log = lambda: "".join(out) + "".join(f"\n--- {f.name}\n" + f.read_text()[-3000:] for f in sorted(logs.iterdir()))
  pids = lambda: [int(pid) for pid in re.findall(r"pid (\d+)", "".join(out))]
  try:
    deadline = time.monotonic() + 300   # a cold start compiles every kernel: about a minute for two replicas on 2 cores
    while not any(line.startswith("ready on") for line in out):
      assert proc.poll() is None and time.monotonic() < deadline, log(); time.sleep(0.2)
    url = f"http://127.0.0.1:{port}"
    yield types.SimpleNamespace(url=url, replicas=[types.SimpleNamespace(url=f"http://127.0.0.1:{base + i}") for i in range(2)],
                                pids=pids()[:2], router_pid=pids()[2], proc=proc, log=log, logs=logs,
                                prometheus=f"http://127.0.0.1:{prometheus}/metrics",
                                client=openai.OpenAI(base_url=url + "/v1", api_key="EMPTY", timeout=60, max_retries=0))
  finally:
    if proc.poll() is None: proc.terminate()
    try: proc.wait(60)
    except subprocess.TimeoutExpired: proc.kill(); proc.wait()
    for pid in pids():   # whatever the script left behind, should it have failed
      try: os.kill(pid, signal.SIGKILL)
      except ProcessLookupError: pass

def counter(replica, name:str) -> float: return metrics(replica)[name]

def counters(cluster, name:str) -> list[float]: return [counter(r, name) for r in cluster.replicas]

def router_counter(cluster, pattern:str) -> float:   # the sum of the router's own samples whose line matches
  return sum(float(v) for v in re.findall(rf"^{pattern}.* (\S+)$", httpx.get(cluster.prometheus, timeout=10).text, re.M))

def test_chat_and_stream_through_the_router(cluster):
  """The router passes chat and SSE streaming through unchanged: the same greedy answer as a replica asked directly, streamed too."""
  assert [m.id for m in cluster.client.models.list().data] == [MODEL]
  kw = dict(model=MODEL, messages=MSGS, max_tokens=12, temperature=0)
  direct = openai.OpenAI(base_url=cluster.replicas[0].url + "/v1", api_key="EMPTY", timeout=60, max_retries=0).chat.completions.create(**kw)
  r = cluster.client.chat.completions.create(**kw)
  assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == MODEL
  assert r.choices[0].message.content == direct.choices[0].message.content and r.usage == direct.usage
  assert r.choices[0].finish_reason == direct.choices[0].finish_reason
  chunks = list(cluster.client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
  assert {c.id for c in chunks} == {chunks[0].id} and all(c.object == "chat.completion.chunk" for c in chunks)
  assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
  assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [r.choices[0].finish_reason]
  assert chunks[-1].usage == r.usage
  with httpx.stream("POST", cluster.url + "/v1/chat/completions", json={**kw, "stream": True}, timeout=60) as raw:   # SSE framing
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
    assert [line for line in raw.iter_lines() if line.startswith("data: ")][-1] == "data: [DONE]"

def test_both_replicas_serve_under_concurrent_load(cluster):
  before, n, max_tokens = counters(cluster, "vllm:generation_tokens_total"), 32, 8
  def one(i):
    messages = [{"role": "user", "content": f"{i} Once upon a time, a {random.choice(['dog', 'cat', 'bird'])} found a {i % 7} ball."}]
    return cluster.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, extra_body={"ignore_eos": True})
  with ThreadPoolExecutor(n) as pool: replies = list(pool.map(one, range(n), timeout=120))
  assert all(r.usage.completion_tokens == max_tokens for r in replies)
  served = [after - b for after, b in zip(counters(cluster, "vllm:generation_tokens_total"), before)]
  assert sum(served) == n * max_tokens and min(served) > 0, served

PREFIXES = {"lily": "Lily and her dog Max went to the big park by the river every morning before school.",
            "tom": "Tom built a small red boat from an old box, and he sailed it across the pond behind his house."}

def test_a_shared_prefix_goes_back_to_the_replica_that_cached_it(cluster):
  """cache_aware: a long system prompt is cached where it was first served; follow-ups that share it, sent 4 at a time (so a router that
  balances by load alone would split them; serve_replicas.py's --balance-abs-threshold 4 keeps a prefix's replica until it has 5 more
  requests in flight than the other), go back there: each replica gets exactly the prompt tokens of the prefixes it cached first, and
  hits the cache for them."""
  def ask(name, question):
    messages = [{"role": "system", "content": " ".join([PREFIXES[name]] * 8)}, {"role": "user", "content": question}]
    return cluster.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2).usage.prompt_tokens
  def check():
    served = {}
    for name in PREFIXES:   # one at a time, so each replica's prompt-token count says where it went
      before = counters(cluster, "vllm:prompt_tokens_total"); n = ask(name, "Who was there?")
      (served[name],) = [i for i, (a, b) in enumerate(zip(counters(cluster, "vllm:prompt_tokens_total"), before)) if a - b == n]
    prompts, hits = counters(cluster, "vllm:prompt_tokens_total"), counters(cluster, "vllm:prefix_cache_hits_total")
    jobs = [(name, f"What happened on day {i}?") for i in range(6) for name in PREFIXES]
    with ThreadPoolExecutor(4) as pool: lengths = list(pool.map(lambda job: ask(*job), jobs, timeout=120))
    prompts = [a - b for a, b in zip(counters(cluster, "vllm:prompt_tokens_total"), prompts)]
    hits = [a - b for a, b in zip(counters(cluster, "vllm:prefix_cache_hits_total"), hits)]
    mine = lambda i: [n for (name, _), n in zip(jobs, lengths) if served[name] == i]   # the follow-ups whose prefix replica i cached
    assert prompts == [sum(mine(i)) for i in range(2)], f"prompt tokens {prompts}, prefixes first served by {served}"
    assert all(hits[i] >= len(mine(i)) * 16 * (min(lengths) // 16 - 1) for i in range(2)), f"hits {hits}, prefixes first served by {served}"
  # vllm-router 0.1.17's cache_aware routes on the prompt's token ids, which it asks the worker for (vLLM's POST
  # /v1/chat/completions/render); without them it routed every request to the least-loaded replica, ties to the first (issue #56)
  check()
  assert not router_counter(cluster, r'vllm_router_kv_routing_inputs_total\{.*result="render_unavailable"'), "the router got no token ids"

def test_chats_through_one_template_spread_over_both_replicas(cluster):
  """64 concurrent short chats that share one system prompt, most of each prompt (a chat template's fixed header stands in: the bundled
  model's template adds none). cache_aware finds that prefix on the replica that served the first chat; with vllm-router's own
  --balance-abs-threshold 64 it sent all of them there (#61). With serve_replicas.py's thresholds it balances once one replica has 5 more
  in flight than the other, and from then on both hold the shared prefix: a chat that matches nothing more goes to the less loaded."""
  # measured once both replicas have every step graph: until then one may run a step eagerly or wait on a capture, and the router rightly
  # sends more to the other, the less loaded
  captured = lambda i: re.search(r"all \d+ step graph units captured| 0 more to capture", (cluster.logs / f"replica-{i}.log").read_text())
  deadline = time.monotonic() + 120
  while not (captured(0) and captured(1)): assert time.monotonic() < deadline, cluster.log(); time.sleep(0.5)
  system, before, n, max_tokens = "You are a kind storyteller who tells short stories.", counters(cluster, "vllm:generation_tokens_total"), 128, 16
  def one(i):
    messages = [{"role": "system", "content": system}, {"role": "user", "content": f"{i}: what did the {('dog', 'cat', 'bird')[i % 3]} see?"}]
    return cluster.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, extra_body={"ignore_eos": True})
  with ThreadPoolExecutor(64) as pool: replies = list(pool.map(one, range(n), timeout=120))
  assert all(r.usage.completion_tokens == max_tokens for r in replies)
  served = [after - b for after, b in zip(counters(cluster, "vllm:generation_tokens_total"), before)]
  assert sum(served) == n * max_tokens and min(served) >= 0.25 * n * max_tokens, f"generated tokens per replica {served}"

def test_a_killed_replica_is_drained(cluster):
  """SIGKILL one replica under streaming load: every stream ends (finished, or an error the client sees) in bounded time, none hangs;
  later requests are all answered, by the survivor."""
  def stream(i):
    finish, text = None, ""
    try:
      for c in cluster.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"{i} Once upon a time"}],
                                                      max_tokens=400, stream=True, extra_body={"ignore_eos": True}):
        if c.choices: finish, text = c.choices[0].finish_reason or finish, text + (c.choices[0].delta.content or "")
      return "finished" if finish == "length" else f"cut after {len(text)} chars without an error"
    except Exception as e:   # an error the client sees: openai's, or its HTTP library's (httpx; httpx2 under openai 3.x)
      if not type(e).__module__.startswith(("openai", "httpx")): raise
      return f"error: {type(e).__name__}"
  with ThreadPoolExecutor(8) as pool:
    streams, deadline = [pool.submit(stream, i) for i in range(8)], time.monotonic() + 60
    while min(running := counters(cluster, "vllm:num_requests_running")) == 0 or sum(running) < len(streams):   # all in, on both
      assert time.monotonic() < deadline and not any(s.done() for s in streams), f"the load never reached both replicas: {running}"
      time.sleep(0.05)
    os.kill(cluster.pids[1], signal.SIGKILL)
    outcomes = [s.result(timeout=90) for s in streams]
  # the streams on the survivor finish; those on the killed replica end in an error the client sees (the 200 and some text are sent: the
  # router cannot retry them elsewhere), none cut short silently
  assert outcomes.count("finished") == running[0] and all(o == "finished" or o.startswith("error") for o in outcomes), (running, outcomes)
  before, t = counter(cluster.replicas[0], "vllm:generation_tokens_total"), time.monotonic()
  def later(i):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": f"{i} The sun"}], max_tokens=8, extra_body={"ignore_eos": True})
    if i % 2: return cluster.client.chat.completions.create(**kw).usage.completion_tokens
    return sum(1 for c in cluster.client.chat.completions.create(**kw, stream=True) if c.choices and c.choices[0].delta.content)
  with ThreadPoolExecutor(4) as pool: assert list(pool.map(later, range(16), timeout=120)) == [8] * 16
  assert counter(cluster.replicas[0], "vllm:generation_tokens_total") - before == 16 * 8 and time.monotonic() - t < 60

def test_ctrl_c_stops_the_router_and_every_replica(cluster):
  cluster.proc.send_signal(signal.SIGINT)
  assert cluster.proc.wait(60) == 0, cluster.log()
  for pid in [cluster.router_pid, *cluster.pids]:
    with pytest.raises(ProcessLookupError): os.kill(pid, 0)
  for url in [cluster.url, *(r.url for r in cluster.replicas)]:
    with pytest.raises(httpx.TransportError): httpx.get(url + "/health", timeout=5)
  assert "Traceback" not in cluster.log(), cluster.log()
