"""Chat, apart from HTTP: an OpenAI chat request (messages, tools, tool_choice, chat_template_kwargs, response_format) -> the prompt and
what the sampler must produce, and the model's text -> reasoning_content, content and tool_calls, whole or streamed. vLLM's chat_utils, its
hermes and llama3_json tool parsers and its deepseek_r1/qwen3 reasoning parsers, in one pass.

The model's chat template says what the model was taught: Hermes <tool_call> tags (Qwen 2.5/3, Hermes) or Llama 3.x's bare JSON calls,
and whether it reasons inside <think> tags (Qwen3, DeepSeek-R1 distills, QwQ). Only templates that mention them get tools or reasoning."""
import json, typing, uuid
import jinja2
from tinyvllm.sampler import compile_grammar
from tinyvllm.sequence import ParamError

# the state each tag starts: reasoning sits in <think> tags, Hermes calls in <tool_call> tags (the newline before one is markup too)
NEXT_STATE = {"<think>": "reasoning", "</think>": "content", "\n<tool_call>": "call", "<tool_call>": "call", "</tool_call>": "content"}
# forced arguments take the layout templates render them in (tojson is json.dumps), the one the model learned
ARGUMENTS_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

def merge(message:dict, delta:dict):   # deltas add up: text concatenates, tool calls append; empty values add nothing
  for key, value in delta.items():
    if value: message[key] = message.get(key, value[:0]) + value

def checked_messages(messages) -> list[dict]:
  """OpenAI's messages: content is a string or a list of text parts, or null (as "", for templates) beside an assistant's tool calls,
  whose arguments (a JSON string) become the dict chat templates expect, as vLLM does. Their results come back as role "tool" messages."""
  text = lambda c: isinstance(c, str) or isinstance(c, list) and all(p["type"] == "text" and isinstance(p["text"], str) for p in c)
  parsed = lambda call: call | {"function": call["function"] | {"arguments": json.loads(call["function"]["arguments"])}}
  try:
    if messages and all(isinstance(m["role"], str) and (text(m.get("content")) or m.get("content") is None) for m in messages):
      return [m | {"content": m.get("content") or ""} | ({"tool_calls": [*map(parsed, m["tool_calls"])]} if m.get("tool_calls") else {})
              for m in messages]
  except (TypeError, KeyError, ValueError, RecursionError): pass
  raise ParamError("messages", "must be a non-empty list of {'role': str, 'content': str or text parts (or null beside JSON tool_calls)}")

def request(tokenizer, grammar_tokenizer, body:dict) -> tuple[list[int], dict | None, typing.Callable[[], "OutputParser"]]:
  """The prompt (tools reach the template as transformers passes them; tool_choice "none" passes none); what the sampler must produce:
  response_format, vLLM's structured_outputs, or a forced tool call (tool_choice "required" or a named function, as vLLM does), compiled
  here so that a bad one is a 400 before any stream; and a factory of per-choice OutputParsers."""
  template = tokenizer.chat_template_text
  tool_format = "hermes" if "<tool_call>" in template else "json" if '"parameters"' in template else None
  tools, choice, template_kwargs = body.get("tools") or [], body.get("tool_choice") or "auto", body.get("chat_template_kwargs") or {}
  try: schemas = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"} for t in tools if t["type"] == "function"}
  except (TypeError, KeyError, AttributeError): schemas = {}
  if len(schemas) != len(tools) or not all(isinstance(name, str) and isinstance(s, dict) for name, s in schemas.items()):
    raise ParamError("tools", "must be a list of {'type': 'function', 'function': {'name': str, 'parameters': JSON schema}}, names distinct")
  named = choice["function"].get("name") if isinstance(choice, dict) and isinstance(choice.get("function"), dict) else None
  if not (choice in ("none", "auto") or choice == "required" and tools or isinstance(named, str) and named in schemas):
    raise ParamError("tool_choice", "must be none, auto, required (with tools) or {'type': 'function', 'function': {'name': one of the tools}}")
  if (calls := bool(tools) and choice != "none") and tool_format is None:
    raise ParamError("tools", "need a chat template with Hermes <tool_call> tags or Llama 3's JSON calls; this model's has neither")
  if own := {"messages", "tools", "bos_token", "eos_token"} & set(template_kwargs): raise ParamError("chat_template_kwargs", f"may not set {own}")
  messages = checked_messages(body.get("messages"))
  try: prompt = tokenizer.encode_chat(messages, **template_kwargs, **({"tools": tools} if calls else {}))
  except Exception as e:   # the template's own words are for the client; a tokenizer's C++ text (lone surrogates, ...) is not
    raise ParamError("messages", f"were refused by the chat template: {e}" if isinstance(e, jinja2.TemplateError) else "could not be tokenized")
  if not prompt: raise ParamError("messages", "render an empty prompt")
  # DeepSeek-R1's form: the template opens <think> in the prompt, so the output starts inside the reasoning
  thinking = "<think>" in template and tokenizer.decode(prompt[-8:]).rstrip().endswith("<think>")
  forced = {named: schemas[named]} if named else schemas if choice == "required" else None
  fmt, structured = body.get("response_format") or {"type": "text"}, body.get("structured_outputs")
  if (kind := fmt.get("type")) not in ("text", "json_object", "json_schema"):
    raise ParamError("response_format", "must have a type of text, json_object or json_schema")
  if forced and (structured or kind != "text"): raise ParamError("tool_choice", "cannot force a tool call and a response format at once")
  try:   # OpenAI's response_format as vLLM's structured outputs
    if kind != "text": structured = {"json_object": True} if kind == "json_object" else {"json": fmt["json_schema"]["schema"]}
    if forced: structured = {"grammar": tool_grammar(tokenizer, tool_format, forced, thinking, parallel=not named)}
    if structured: compile_grammar(structured, grammar_tokenizer)
  except (ParamError, KeyError, TypeError) as e:   # named after the field it came from
    raise ParamError("tools" if forced else "structured_outputs" if kind == "text" else "response_format", f"is not valid ({e})") from None
  return prompt, structured, lambda: OutputParser(calls and tool_format, "<think>" in template, thinking)

def tool_grammar(tokenizer, tool_format:str, schemas:dict[str, dict], thinking:bool, parallel:bool) -> str:
  """Lark for llguidance that admits only calls of these functions in the template's markup (one, or several if parallel); %json embeds
  each one's parameters schema. Tags that are tokens of the vocabulary are written bare, so that they match those tokens."""
  tag, key = lambda text: text if text in tokenizer.specials else json.dumps(text), "arguments" if tool_format == "hermes" else "parameters"
  call = " | ".join(json.dumps(f'{{"name": {json.dumps(name)}, "{key}": ') + f" %json {json.dumps(schema | {'x-guidance': ARGUMENTS_STYLE})} " + '"}"'
                    for name, schema in schemas.items())
  start = f'{tag("</think>")} "\\n\\n" ' if thinking else ""   # a reasoning turn the prompt opened ends at once
  if tool_format == "json": return f"start: {start}({call})"   # Llama 3 templates take one call per turn
  return f'start: {start}tool_call{"+" * parallel}\ntool_call: "\\n"? {tag("<tool_call>")} "\\n" ({call}) "\\n" {tag("</tool_call>")}'

class OutputParser:
  """One choice's text, as it streams in, as deltas of reasoning_content, content and tool_calls. A tail that may start a tag is held until
  the next delta shows what it is, and a call until its closing tag; markup that does not parse is content. Llama 3's JSON form is a
  whole output that parses as one call (its <|python_tag|> is a special token, so never in the text)."""
  def __init__(self, tool_format:str | None, reasoning:bool, thinking:bool):
    self.tags = {"content": ["<think>"] * reasoning + ["\n<tool_call>", "<tool_call>"] * (tool_format == "hermes"), "reasoning": ["</think>"],
                 "call": ["</tool_call>"]}
    self.state = "reasoning" if thinking else "json" if tool_format == "json" else "content"
    self.held, self.calls, self.message, self.finish_reason, self.stop_reason = "", 0, {"role": "assistant", "content": ""}, None, None

  def feed(self, text:str, finish_reason:str | None=None, stop_reason:str | int | None=None) -> dict:
    """The next delta. A finish_reason ends the choice: what was held goes out, and a choice that called tools ends in "tool_calls"."""
    self.held, delta, final = self.held + text, {}, finish_reason is not None
    if self.state == "json" and (final or not self.held.lstrip().startswith("{") and self.held.strip()):   # a call is known at its end
      if call := final and self.call(self.held): merge(delta, {"tool_calls": [call]}); self.held = ""
      self.state = "content"
    while self.state != "json":
      tags = self.tags[self.state]
      tag = min((tag for tag in tags if tag in self.held), key=self.held.find, default=None)
      end = self.held.find(tag) if tag else len(self.held) if final else next(   # a tail that may begin a tag waits
        (i for i in range(len(self.held)) if any(t.startswith(self.held[i:]) for t in tags)), len(self.held))
      if self.state == "call":   # the call's text starts with its opening tag
        if not tag and not final: break
        call = tag and self.call(self.held[:end].split("<tool_call>", 1)[1])
        merge(delta, {"tool_calls": [call]} if call else {"content": self.held[:end] + (tag or "")})
      else: merge(delta, {"reasoning_content" if self.state == "reasoning" else "content": self.held[:end]})
      if not tag: self.held = self.held[end:]; break
      self.state, self.held = NEXT_STATE[tag], self.held[end if NEXT_STATE[tag] == "call" else end + len(tag):]
    merge(self.message, delta | {"tool_calls": [{k: v for k, v in c.items() if k != "index"} for c in delta.get("tool_calls", [])]})
    if final: self.finish_reason, self.stop_reason = "tool_calls" if finish_reason == "stop" and self.calls else finish_reason, stop_reason
    return delta

  def reply(self) -> dict:   # the whole message, as a non-streaming response carries it: content is null beside tool calls alone
    return self.message | ({"content": None} if self.calls and not self.message["content"].strip() else {})

  def call(self, text:str) -> dict | None:   # a tool call as OpenAI's delta, or None if the text is not one
    try: call = json.loads(text); name, args = call["name"], call["arguments" if "arguments" in call else "parameters"]   # Llama 3: parameters
    except (ValueError, TypeError, KeyError): return None
    if not isinstance(name, str) or not isinstance(args, dict): return None
    self.calls += 1
    return {"index": self.calls - 1, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
