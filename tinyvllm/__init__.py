"""tinyvllm, a vLLM-style LLM serving engine on tinygrad. The public API, under vLLM's names: LLM (offline batches), LLMEngine and
AsyncLLM (the engine, alone or behind `python -m tinyvllm.serve`), Config, SamplingParams and the outputs."""
from tinyvllm.config import Config
from tinyvllm.sequence import SamplingParams, RequestOutput, CompletionOutput
from tinyvllm.llm_engine import LLM, LLMEngine, AsyncLLM   # the public API, as vLLM's
