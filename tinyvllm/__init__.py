from tinyvllm.config import Config
from tinyvllm.sequence import SamplingParams, RequestOutput, CompletionOutput
from tinyvllm.llm_engine import LLM, LLMEngine, AsyncLLM
__all__ = ["Config", "SamplingParams", "RequestOutput", "CompletionOutput", "LLM", "LLMEngine", "AsyncLLM"]
