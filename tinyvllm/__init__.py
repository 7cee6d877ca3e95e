from tinyvllm.config import Config
from tinyvllm.sequence import SamplingParams, RequestOutput, CompletionOutput
from tinyvllm.llm_engine import LLM, LLMEngine, AsyncLLM   # the public API, as vLLM's
