from tinyvllm.config import Config
from tinyvllm.sequence import SamplingParams
