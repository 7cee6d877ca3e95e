import enum, itertools, random, time
from dataclasses import dataclass, field

@dataclass
class SamplingParams:
  """Per-request sampling knobs with vLLM's names and defaults."""
  n: int = 1
  max_tokens: int = 16
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = -1                        # -1 (or 0) keeps the whole vocabulary
  seed: int | None = None
  stop: str | list[str] | None = None
  stop_token_ids: list[int] = field(default_factory=list)
  ignore_eos: bool = False
  def __post_init__(self):
    self.stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
    for ok, msg in [(self.n >= 1, "n must be at least 1"), (self.max_tokens >= 1, "max_tokens must be at least 1"),
                    (self.temperature >= 0, "temperature must be non-negative"), (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
                    (self.top_k == -1 or self.top_k >= 0, "top_k must be -1 (off) or positive"), (all(self.stop), "stop strings must not be empty")]:
      if not ok: raise ValueError(f"{msg}, got {self}")

class Status(enum.Enum): WAITING = 0; RUNNING = 1; FINISHED = 2

@dataclass
class CompletionOutput:
  index: int
  text: str
  token_ids: list[int]
  finish_reason: str | None = None       # "stop", "length" or "abort"

@dataclass
class RequestOutput:
  request_id: str
  prompt_token_ids: list[int]
  outputs: list[CompletionOutput]
  finished: bool = False
  metrics: dict = field(default_factory=dict)

class Sequence:
  """One generated continuation: its tokens, how many of them already sit in the KV cache, and its block table."""
  ids = itertools.count()
  def __init__(self, request_id:str, prompt_ids:list[int], params:SamplingParams, index:int=0, parent:"Sequence|None"=None):
    self.seq_id, self.request_id, self.index, self.parent, self.params = next(Sequence.ids), request_id, index, parent, params
    self.prompt_token_ids, self.token_ids, self.num_computed_tokens = prompt_ids, list(prompt_ids), 0   # the prompt list is shared, not copied
    self.block_table: list[int] = []
    self.status, self.finish_reason = Status.WAITING, None
    # forked siblings get distinct seeds so n>1 with one seed still gives n different samples
    self.seed = (params.seed + index if params.seed is not None else random.getrandbits(31)) & 0x7fffffff
    self.block_hashes: list[bytes] = []     # chained hashes of its full, computed blocks (prefix caching)
    self.held_text, self.detok = "", None   # detokenized text not yet emitted: it may be the start of a stop string
    self.arrival_time, self.first_token_time, self.finish_time = time.monotonic(), None, None
  def __len__(self): return len(self.token_ids)
  @property
  def num_prompt_tokens(self): return len(self.prompt_token_ids)
  @property
  def output_ids(self): return self.token_ids[self.num_prompt_tokens:]
  @property
  def is_finished(self): return self.status == Status.FINISHED
