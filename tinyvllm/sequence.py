"""A request's data, with vLLM's names: SamplingParams (checked here, once, for the server and the offline API), the Sequence that
carries one request through llm_engine, scheduler, block_manager and model_runner, and the outputs llm_engine returns. Plain data,
imported by every layer; it imports nothing of the engine."""
import dataclasses, enum, math

# the stop-list bounds keep each token's stop search short, so one request's stop lists can't stall the step
MAX_STOP_STRINGS, MAX_STOP_LEN = 32, 256

class ParamError(ValueError):
  """A request field out of range; `param` names it, so the server's 400 can say which."""
  def __init__(self, param:str, message:str): super().__init__(f"{param} {message}"); self.param = param

# vLLM's ranges: (type, check, what the check asks); seed and logprobs may also be None. n > 1 and any logprobs are refused: they went to
# pay for tensor parallelism (README, "Not supported, and why")
RANGES = {"n": (int, lambda n: n == 1, "1: n > 1 is not supported"), "max_tokens": (int, lambda n: n >= 1, "at least 1"),
          "temperature": (float, lambda t: t >= 0, "non-negative"), "top_p": (float, lambda p: 0 < p <= 1, "in (0, 1]"),
          "min_p": (float, lambda p: 0 <= p <= 1, "in [0, 1]"), "top_k": (int, lambda k: -1 <= k < 2**63, "-1 or 0 (off), or positive"),
          "seed": (int, lambda s: -2**63 <= s < 2**63, "a 64-bit integer"), "logprobs": (int, lambda k: False, "None: logprobs are not supported")}

@dataclasses.dataclass
class SamplingParams:
  """Per-request sampling knobs with vLLM's names, defaults and ranges, checked once here for the server and the offline API alike."""
  # how each token is drawn. top_k: -1 or 0 keeps the whole vocabulary; min_p: drop tokens less likely than min_p times the most likely one
  temperature: float = 1.0; top_p: float = 1.0; top_k: int = -1; min_p: float = 0.0; seed: int | None = None
  # when the output ends
  max_tokens: int = 16; stop: str | list[str] | None = None; ignore_eos: bool = False
  # what the output holds. structured_outputs: {"json": schema}, {"json_object": True}, {"regex": str}, {"choice": [str]} or
  # {"grammar": lark}; logprobs: only None
  n: int = 1; structured_outputs: dict | None = None; logprobs: int | None = None
  def __post_init__(self):
    # each number finite, of its field's type and in its range, or ParamError: JSON allows 10**309 or NaN, which would overflow or poison
    # the step's float32 buffer
    for name, (kind, ok, rule) in RANGES.items():
      if (value := getattr(self, name)) is None and name in ("seed", "logprobs"): continue
      if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise ParamError(name, "must be an integer" if kind is int else "must be a number")
      try: finite = math.isfinite(value := kind(value))
      except OverflowError: raise ParamError(name, "is too large") from None
      if not finite or not ok(value): raise ParamError(name, f"must be {rule}" if finite else "must be finite")
      setattr(self, name, value)
    self.stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
    if len(self.stop) > MAX_STOP_STRINGS or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_LEN for s in self.stop):
      raise ParamError("stop", f"takes at most {MAX_STOP_STRINGS} non-empty strings of at most {MAX_STOP_LEN} characters")

class Status(enum.Enum): WAITING = 0; RUNNING = 1; FINISHED = 2

@dataclasses.dataclass
class CompletionOutput:
  # finish_reason: "stop" or "length" (an aborted request gets no more outputs); stop_reason: the stop string that ended
  # it (None for EOS, length or abort), as in vLLM
  index: int; text: str; token_ids: list[int]; finish_reason: str | None = None; stop_reason: str | int | None = None
  def __add__(self, delta:"CompletionOutput") -> "CompletionOutput":
    """The output so far and the next delta, as one."""
    return dataclasses.replace(delta, text=self.text + delta.text, token_ids=self.token_ids + delta.token_ids)

@dataclasses.dataclass
class RequestOutput:
  request_id: str; prompt_token_ids: list[int]; outputs: list[CompletionOutput]; finished: bool = False

class Sequence:
  """One generated continuation: its tokens, how many of them already sit in the KV cache, and its block table."""
  def __init__(self, request_id:str, prompt_ids:list[int], params:SamplingParams, seed:int=0, detok=None, matcher=None):
    self.request_id, self.params, self.status, self.seed = request_id, params, Status.WAITING, seed
    self.prompt_token_ids, self.token_ids, self.num_prompt_tokens = prompt_ids, list(prompt_ids), len(prompt_ids)
    # block_table: its KV blocks, in order; block_hashes: the chained hashes of its full, computed blocks (prefix caching)
    self.num_computed_tokens, self.block_table, self.block_hashes = 0, [], []
    # held_text: detokenized text not yet emitted (it may start a stop string); detok: its detokenizer; matcher: llguidance's state of
    # its grammar (structured outputs)
    self.held_text, self.detok, self.matcher = "", detok, matcher
  def __len__(self): return len(self.token_ids)
