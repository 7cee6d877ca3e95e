"""The tokenizer: text and chat messages to token ids, and token ids back to text one token at a time, from a model folder's
tokenizer.json and chat template. llm_engine encodes prompts with it and gives each sequence a detokenizer, which it calls per token
(process_output); chat.py renders chat prompts through it. Structured outputs' grammars are compiled here against its vocabulary
(llguidance), once per request, by chat.py for the server and llm_engine offline; sampler.py masks by them. It touches no tensor."""
import datetime, functools, json, os, pathlib, typing, jinja2, jinja2.ext, jinja2.sandbox, llguidance, tokenizers
from llguidance import LLMatcher
from tinyvllm.sequence import ParamError

def _json(*path) -> dict: return json.loads(pathlib.Path(p).read_text(encoding="utf-8")) if os.path.isfile(p := os.path.join(*path)) else {}
def _name(token): return token.get("content") if isinstance(token, dict) else token
# a message's content: a string, or its text parts joined by newlines, as vLLM does
def _text(c): return c if c is None or isinstance(c, str) else "\n".join(p["text"] for p in c if p.get("type") == "text")
def _raise(msg): raise jinja2.exceptions.TemplateError(msg)

class Tokenizer:
  """A Hugging Face tokenizer.json (as every hub model folder carries), run by HF's own `tokenizers`, with HF's special-token, BOS/EOS
  and chat-template rules. sentencepiece and tiktoken `tokenizer.model` files need converting once: transformers writes tokenizer.json."""
  def __init__(self, model_dir:str):
    if not os.path.isfile(path := os.path.join(model_dir, "tokenizer.json")): raise FileNotFoundError(f"no tokenizer.json in {model_dir}: "
      "from a tokenizer.model, transformers' AutoTokenizer.from_pretrained(model_dir).save_pretrained(model_dir) writes one")
    try: self.hf = hf = tokenizers.Tokenizer.from_file(path)
    except Exception as e: raise ValueError(f"{model_dir}: tokenizer.json could not be read ({e})") from None
    config, special_map = _json(model_dir, "tokenizer_config.json"), _json(model_dir, "special_tokens_map.json")
    # added tokens: their strings encode to their ids
    self.specials = {t.content: i for i, t in hf.get_added_tokens_decoder().items()}
    # HF adds BOS in the post-processor ("<bos> $A"), not with a flag: what it adds to an empty text is the BOS
    fmt_bos = next(iter(hf.encode("").tokens), None)
    self.bos_token, self.eos_token = (_name(config.get(k, special_map.get(k, fmt))) for k, fmt in (("bos_token", fmt_bos), ("eos_token", None)))
    self.bos_id = self.specials.get(self.bos_token); self.add_bos = config.get("add_bos_token", fmt_bos is not None) and self.bos_id is not None
    eos = [_json(model_dir, f).get("eos_token_id") for f in ("generation_config.json", "config.json")] + [self.specials.get(self.eos_token)]
    self.eos_ids = {i for x in eos for i in (x if isinstance(x, list) else [x]) if i is not None}
    # some configs hold several named templates
    if isinstance(tmpl := config.get("chat_template"), list): tmpl = {t["name"]: t["template"] for t in tmpl}.get("default")
    if tmpl is None and os.path.isfile(p := os.path.join(model_dir, "chat_template.jinja")): tmpl = pathlib.Path(p).read_text(encoding="utf-8")
    # the environment transformers renders chat templates in, so that prompts match HF's apply_chat_template
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    # transformers' tojson: jinja's own escapes html
    env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent, **kw)
    env.globals.update(raise_exception=_raise, strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))
    # the template's text too: chat.py reads its markup
    self.chat_template, self.chat_template_text = env.from_string(tmpl) if tmpl else None, tmpl or ""

  def encode(self, text:str, add_special_tokens:bool=True) -> list[int]:
    # BOS is ours to add (add_bos_token may override the post-processor)
    return ([self.bos_id] if add_special_tokens and self.add_bos else []) + self.hf.encode(text, add_special_tokens=False).ids

  def detokenizer(self, prompt_ids:list[int]) -> typing.Callable[[int], str | None]:
    """vLLM's incremental detokenizer, as `tokenizers`' DecodeStream: a token's new text, decoded in the context of the tokens before it
    (sentencepiece drops the leading space of a text's first token), or None while a character's bytes are incomplete."""
    streams = [tokenizers.decoders.DecodeStream(prompt_ids, skip_special_tokens=True)]
    def step(token:int) -> str | None:
      # invalid UTF-8 in the context can break DecodeStream's prefix check (vLLM #17448): go on afresh, as vLLM does
      try: return streams[-1].step(self.hf, token)
      except Exception: streams.append(tokenizers.decoders.DecodeStream(skip_special_tokens=True))
      return streams[-1].step(self.hf, token)
    return step

  def encode_chat(self, messages:list[dict], add_generation_prompt:bool=True, **template_kwargs) -> list[int]:
    """The conversation as the model's chat template renders it (a base model's: the contents a line each), as token ids; BOS is added
    only where the template has not written it. template_kwargs go to the template: tools=, enable_thinking=, ..."""
    messages = [m | {"content": _text(m["content"])} if "content" in m else m for m in messages]
    text = self.chat_template.render(messages=messages, add_generation_prompt=add_generation_prompt, bos_token=self.bos_token or "",
      eos_token=self.eos_token or "", **template_kwargs) if self.chat_template is not None else "\n".join(m.get("content") or "" for m in messages)
    return self.encode(text, add_special_tokens=not (self.bos_token and text.startswith(self.bos_token)))

# compact JSON (no endless whitespace, and no lone space tokens: sentencepiece-style vocabularies such as the bundled model's merge a
# space into the token after it, so a grammar that needs `": "` could reach no token that continues it)
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
# vLLM's structured-output kinds
GRAMMARS = {"json": lambda schema: LLMatcher.grammar_from_json_schema(schema, defaults=JSON_STYLE),
            "json_object": lambda _: LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_STYLE),
            # llguidance's own builder: a regex, a Lark or GBNF grammar, a list of strings to choose from
            **{kind: functools.partial(llguidance.grammar_from, kind) for kind in ("regex", "grammar", "choice")}}

def grammar_tokenizer(tokenizer, vocab_size:int) -> llguidance.LLTokenizer:
  """llguidance's view of the vocabulary (it parses the tokenizer's JSON again itself), built once per model before the server answers:
  at 128k tokens one of the largest parts of a warm start (BENCHMARKS.md, issue #40)."""
  return llguidance.LLTokenizer(tokenizer.hf.to_str(), n_vocab=vocab_size, eos_token=sorted(tokenizer.eos_ids))

def compile_grammar(structured_outputs:dict, ll_tokenizer:llguidance.LLTokenizer) -> LLMatcher:
  """One of {"json": schema}, {"json_object": True}, {"regex": str}, {"choice": [str]}, {"grammar": lark} compiled against llguidance's
  tokenizer (grammar_tokenizer's) into the matcher that follows one request's output. Once per request, by the side that checks it
  (chat.py for the server, off the engine thread; LLMEngine.check offline): the compile is the costly part, and it is the check."""
  if not isinstance(structured_outputs, dict) or len(structured_outputs) != 1 or next(iter(structured_outputs)) not in GRAMMARS:
    raise ParamError("structured_outputs", f"takes one of {sorted(GRAMMARS)}")
  try: grammar = GRAMMARS[kind := next(iter(structured_outputs))](structured_outputs[kind])
  except (ValueError, TypeError) as e: raise ParamError("structured_outputs", f"{kind} is not valid: {e}") from None
  # a matcher never raises for its grammar: a bad one leaves it in an error state that says why
  if (matcher := LLMatcher(ll_tokenizer, grammar)).is_error(): raise ParamError("structured_outputs", matcher.get_error())
  return matcher
