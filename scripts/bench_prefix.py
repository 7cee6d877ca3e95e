#!/usr/bin/env python3
"""Multi-turn chat, each user with a long system prompt of its own: the prefix-cache hit rate on each replica behind a router (#56).

--users chat at once, each for --turns turns, one after the other: turn t sends the user's system prompt (--sys-tokens random words,
about one token each in Llama 3's tokenizer; distinct per user and per --seed), the conversation so far (the earlier user messages and
the replies the server gave) and a new short user message, with max_tokens=--max-tokens (ignore_eos). Each replica's /metrics
(--replica-urls) is read before and after: the deltas of vllm:prefix_cache_hits_total over vllm:prefix_cache_queries_total (prompt
tokens) are its hit rate, and summed over the replicas, the run's. The requests each replica was sent come from the router's own metrics
(--router-metrics, its --prometheus-port: vllm_router_processed_requests_total), as tinyvllm counts tokens, not requests. A user's first
turn finds nothing cached, and a later one at most what the user's previous turn computed (its prompt and reply): that bound is printed
beside the rate (from the usage the server reports), and the rate over turns 2+ (hits over the queries less the first turns' prompts).

  python scripts/serve_replicas.py --gpus 0 1 --device CUDA --config llama-3.2-1b --router-args '--prometheus-port 29000' &
  python scripts/bench_prefix.py --url http://127.0.0.1:8000 --replica-urls http://127.0.0.1:8100 http://127.0.0.1:8101 \
    --router-metrics http://127.0.0.1:29000/metrics                       # 8 users x ~2000-token system prompts x 8 turns
  python scripts/bench_prefix.py --url http://127.0.0.1:8000 --users 2 --sys-tokens 60 --turns 3 --max-tokens 8   # the bundled model
Uses the official `openai` client when it is installed, else raw httpx. The last line is the summary as JSON.
"""
import argparse, asyncio, json, random, re, time
import httpx
try: from openai import AsyncOpenAI
except ImportError: AsyncOpenAI = None

WORDS = ("the a little girl boy dog cat sun tree house park ball happy sad big small red blue green went saw played ran jumped found "
         "said mom dad friend day night sky water toy box cake bird fish car book door garden flower rain snow walk look smile help").split()
REPLICA = {"queries": "vllm:prefix_cache_queries_total", "hits": "vllm:prefix_cache_hits_total", "prompt": "vllm:prompt_tokens_total"}

def scrape(url:str) -> dict[str, float]:   # {sample with its labels: value}, comments skipped
  text = httpx.get(url, timeout=10).raise_for_status().text
  return {m[1]: float(m[2]) for m in re.finditer(r"^([^#\s]\S*) (\S+)$", text, re.M)}

def counters(args) -> dict:
  replicas = [{k: sum(v for s, v in scrape(u.rstrip("/") + "/metrics").items() if s.split("{")[0] == name) for k, name in REPLICA.items()}
              for u in args.replica_urls]
  router = scrape(args.router_metrics) if args.router_metrics else {}
  for u, r in zip(args.replica_urls, replicas):   # the router labels its samples with the worker's URL as it was given
    r["requests"] = sum(v for s, v in router.items() if s.startswith("vllm_router_processed_requests_total") and f'"{u.rstrip("/")}"' in s)
  return replicas

async def chat_openai(client, model:str, messages:list, args) -> tuple[str, int, int]:   # reply, prompt and reply tokens
  r = await client.chat.completions.create(model=model, messages=messages, max_tokens=args.max_tokens, temperature=args.temperature,
                                           extra_body={"ignore_eos": True})
  return r.choices[0].message.content, r.usage.prompt_tokens, r.usage.completion_tokens

async def chat_httpx(client, model:str, messages:list, args) -> tuple[str, int, int]:
  r = await client.post("/v1/chat/completions", json={"model": model, "messages": messages, "max_tokens": args.max_tokens,
                                                      "temperature": args.temperature, "ignore_eos": True})
  if r.status_code != 200: raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
  return (obj := r.json())["choices"][0]["message"]["content"], obj["usage"]["prompt_tokens"], obj["usage"]["completion_tokens"]

async def user(chat, client, model:str, u:int, args, log:list):
  rng = random.Random(f"{args.seed}-{u}")
  words = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))
  messages = [{"role": "system", "content": f"You are assistant {u}. " + words(args.sys_tokens)}]
  for t in range(args.turns):
    messages.append({"role": "user", "content": f"Question {t + 1}: {words(10)}?"})
    t0 = time.perf_counter()
    try: reply, prompt_tokens, reply_tokens = await chat(client, model, messages, args)
    except Exception as e: log.append((u, t, None, None, time.perf_counter() - t0, f"{type(e).__name__}: {e}")); return
    log.append((u, t, prompt_tokens, reply_tokens, time.perf_counter() - t0, None))
    messages.append({"role": "assistant", "content": reply})

async def run(args) -> tuple[list, float]:
  url, log = args.url.rstrip("/"), []
  async with httpx.AsyncClient(base_url=url, timeout=args.timeout, limits=httpx.Limits(max_connections=args.users + 4)) as hc:
    model = (await hc.get("/v1/models")).raise_for_status().json()["data"][0]["id"]
    chat, client = (chat_openai, AsyncOpenAI(base_url=f"{url}/v1", api_key="EMPTY", max_retries=0, timeout=args.timeout, http_client=hc)) \
      if AsyncOpenAI is not None else (chat_httpx, hc)
    t = time.perf_counter()
    await asyncio.gather(*(user(chat, client, model, u, args, log) for u in range(args.users)))
    return log, time.perf_counter() - t

def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--url", default="http://127.0.0.1:8000", help="the router (or one server)")
  p.add_argument("--replica-urls", nargs="+", default=["http://127.0.0.1:8100", "http://127.0.0.1:8101"], help="each replica's base URL")
  p.add_argument("--router-metrics", help="the router's Prometheus URL, e.g. http://127.0.0.1:29000/metrics: requests per replica")
  p.add_argument("--users", type=int, default=8)
  p.add_argument("--sys-tokens", type=int, default=2000, help="random words in each user's system prompt")
  p.add_argument("--turns", type=int, default=8)
  p.add_argument("--max-tokens", type=int, default=32, help="tokens in each reply")
  p.add_argument("--temperature", type=float, default=0.6)
  p.add_argument("--seed", type=int, default=0, help="another seed, other system prompts: no hits from an earlier run's cache")
  p.add_argument("--timeout", type=float, default=300, help="seconds for one request")
  p.add_argument("--label", default="", help="a name for this run in the summary (e.g. the router's policy)")
  args = p.parse_args()
  before = counters(args)
  log, wall = asyncio.run(run(args))
  after = counters(args)
  d = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before)]
  rate = lambda hits, queries: hits / queries if queries else float("nan")
  for u, r in zip(args.replica_urls, d):
    sent = f"{r['requests']:.0f} requests (the router's count), " if args.router_metrics else ""
    print(f"replica {u}: {sent}{r['prompt']:.0f} prompt tokens, prefix cache {r['hits']:.0f} hits / {r['queries']:.0f} queries = "
          f"{rate(r['hits'], r['queries']):.1%}")
  ok, failed = [e for e in log if e[5] is None], [e for e in log if e[5] is not None]
  hits, queries, total = sum(r["hits"] for r in d), sum(r["queries"] for r in d), sum(e[2] for e in ok)
  # at most what the same user's previous turn computed (its prompt and reply) can hit: the first turn finds nothing
  prev = {(e[0], e[1]): e[2] + e[3] for e in ok}
  bound = sum(min(e[2], prev.get((e[0], e[1] - 1), 0)) for e in ok)
  first = sum(e[2] for e in ok if e[1] == 0)   # the first turns' prompt tokens: the rate over the later turns counts every hit there
  summary = {"label": args.label, "url": args.url, "users": args.users, "sys_words": args.sys_tokens, "turns": args.turns,
             "max_tokens": args.max_tokens, "seed": args.seed, "client": "openai" if AsyncOpenAI else "httpx", "ok": len(ok),
             "failed": len(failed), "wall_s": round(wall, 2), "prompt_tokens": total,
             "first_prompt_tokens_mean": round(first / max(1, args.users), 1), "hit_rate": round(rate(hits, queries), 4),
             "best_rate": round(rate(bound, total), 4), "later_turns_rate": round(rate(hits, queries - first), 4),
             "hits": [r["hits"] for r in d], "queries": [r["queries"] for r in d], "requests": [r["requests"] for r in d],
             "latency_p50_s": round(sorted(e[4] for e in ok)[len(ok) // 2], 3) if ok else None}
  print(f"{len(ok)} ok, {len(failed)} failed" + (f", first: {failed[0][5]}" if failed else "") + f"; {wall:.1f} s; client "
        f"{summary['client']}; first prompts {summary['first_prompt_tokens_mean']:.0f} tokens on average, {total} prompt tokens in all")
  print(f"SUMMARY | prefix {args.label} | {args.users} users x {args.sys_tokens}-word system prompts x {args.turns} turns | hit rate "
        f"{rate(hits, queries):.1%} summed over {len(d)} replicas (best possible {rate(bound, total):.1%}; turns 2+ "
        f"~{rate(hits, queries - first):.1%}) | requests per replica {[int(r['requests']) for r in d] if args.router_metrics else 'n/a'} |",
        flush=True)
  print(json.dumps(summary))

if __name__ == "__main__": main()
