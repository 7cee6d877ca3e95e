"""tinyvllm, a vLLM-style LLM serving engine on tinygrad. The public API, under vLLM's names: LLM (offline batches), LLMEngine and
AsyncLLM (the engine, alone or behind `python -m tinyvllm.serve`), Config, SamplingParams and the outputs."""
# the public API, as vLLM's: all of it as the engine takes it (Config from config.py; SamplingParams and the outputs from sequence.py)
from tinyvllm.llm_engine import LLM, LLMEngine, AsyncLLM, Config, SamplingParams, RequestOutput, CompletionOutput
