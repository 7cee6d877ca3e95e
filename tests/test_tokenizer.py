"""Tokenizer tests against independent references: ids recorded with sentencepiece / tiktoken (tests/data/*) and those libraries
themselves, the `tokenizers` library and transformers' apply_chat_template. The Llama 2 / Llama 3 tokenizer files in tests/data are
Meta's (licenses beside them); tinyvllm reads the tokenizer.json that conftest.py makes of them with transformers."""
import json, pathlib, random, re, time
import jinja2, pytest, sentencepiece, tiktoken.load, tokenizers
from tinyvllm.tokenizer import Tokenizer
from conftest import DATA, sentencepiece_to_hf

STORIES = pathlib.Path(__file__).parents[1] / "tinyvllm" / "stories260K"
STORIES_SP = DATA / "stories260K-sentencepiece" / "tokenizer.model"  # the original of the bundled tokenizer.json
# Meta's Llama 3 split regex (the tiktoken ranks file does not carry it; transformers' TikTokenConverter splits with it)
LLAMA3_PAT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
MULTIBYTE = ["naïve café, Straße, crème brûlée", "日本語のテキストと中文字符", "emoji 🦙🚀👍🏽 and 👨‍👩‍👧 family", "Ελληνικά, русский, עברית, العربية",
             "mixed: a🦙b日c é\tdone\n", "The quick brown fox jumps over the lazy dog."]

@pytest.fixture(scope="module")
def folders(llama3_dir, llama2_dir): return {"llama3": llama3_dir, "llama2": llama2_dir, "stories": STORIES}

@pytest.fixture(scope="module", params=["llama3", "llama2", "stories"])
def tok(request, folders): return Tokenizer(str(folders[request.param]))

@pytest.mark.parametrize("name,ref", [("llama3", DATA / "llama3-tiktoken" / "reference_encodings.json"),
                                      ("llama2", DATA / "llama2-sentencepiece" / "reference_encodings.json"),
                                      ("stories", DATA / "tokenizer_reference.json")])
def test_reference_encodings(folders, name, ref):
  ref, tok = json.loads(ref.read_text()), Tokenizer(str(folders[name]))
  assert (tok.hf.get_vocab_size(), tok.bos_id) == (ref["vocab_size"], ref["bos_id"])
  for case in ref["cases"]:
    assert tok.encode(case["text"], add_special_tokens=False) == case["token_ids"], case["text"]
    assert tok.encode(case["text"]) == [ref["bos_id"]] + case["token_ids"]  # both families add BOS by default
    assert tok.hf.decode([ref["bos_id"]] + case["token_ids"]) == case.get("decoded", case["text"])
  if "special_text_case" in ref:  # special-token strings in text become special ids; decode skips them
    case = ref["special_text_case"]
    assert tok.encode(case["text"], add_special_tokens=False) == case["token_ids"]
    assert tok.hf.decode(case["token_ids"]) == "user\n\nHi!"
  if "eos_id" in ref: assert ref["eos_id"] in tok.eos_ids

def test_llama3_special_tokens(folders):
  tok, ref = Tokenizer(str(folders["llama3"])), json.loads((DATA / "llama3-tiktoken" / "reference_encodings.json").read_text())
  assert LLAMA3_PAT == ref["pat_str"] == json.loads(tok.hf.to_str())["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
  assert all(tok.specials[name] == i for name, i in ref["special_tokens_first"].items())
  assert len(tok.specials) == ref["n_special_tokens"] and 128009 in tok.eos_ids  # eos_token <|eot_id|> from tokenizer_config.json

@pytest.mark.parametrize("text", MULTIBYTE)
def test_roundtrip(tok, text):
  ids = tok.encode(text)
  assert ids[0] == tok.bos_id and tok.hf.decode(ids) == text

def _deltas(tok, prompt_ids, out_ids, chunks):
  det, deltas, i = tok.detokenizer(prompt_ids), [], 0
  for n in chunks:
    deltas.append("".join(det(t) or "" for t in out_ids[i:i + n])); i += n
  assert i == len(out_ids)
  return det, deltas

@pytest.mark.parametrize("text", MULTIBYTE)
def test_incremental_detokenizer(tok, text):
  prompt_ids, out_ids = tok.encode("Once upon a time"), tok.encode(" " + text, add_special_tokens=False)
  expect = tok.hf.decode(prompt_ids + out_ids)[len(tok.hf.decode(prompt_ids)):]  # the output text in context
  assert expect.strip() == text.strip()
  rng = random.Random(0)
  for chunks in ([1] * len(out_ids), [len(out_ids)], None):
    if chunks is None:  # random chunk sizes
      chunks, left = [], len(out_ids)
      while left: chunks.append(n := min(left, rng.randint(1, 3))); left -= n
    det, deltas = _deltas(tok, prompt_ids, out_ids, chunks)
    assert "".join(deltas) == expect and not any("\ufffd" in d for d in deltas)
  if isinstance(tok.hf.decoder, tokenizers.decoders.ByteLevel): assert expect == tok.hf.decode(out_ids)  # byte-level BPE keeps the space anyway

def test_incremental_holds_back_partial_characters(folders):
  for folder in ("llama3", "llama2"):
    tok = Tokenizer(str(folders[folder]))
    prompt_ids, out_ids = tok.encode("Hi"), tok.encode("🦙🦙", add_special_tokens=False)  # byte tokens in both
    det, deltas = _deltas(tok, prompt_ids, out_ids, [1] * len(out_ids))
    assert "" in deltas and not any("\ufffd" in d for d in deltas)
    assert "".join(deltas) == tok.hf.decode(prompt_ids + out_ids)[len(tok.hf.decode(prompt_ids)):] and "".join(deltas).endswith("🦙🦙")

def test_incremental_work_does_not_grow_with_the_sequence(folders):
  """Each token decodes a short window, not the whole sequence: after a 50k-token context a token costs what it costs after 5 tokens."""
  tok = Tokenizer(str(folders["llama3"]))
  out_ids = tok.encode(" ".join(MULTIBYTE * 5), add_special_tokens=False)
  def run(context):
    det = tok.detokenizer(context); first = det(out_ids[0]) or ""   # the first token decodes the context once
    start = time.perf_counter(); text = first + "".join(det(i) or "" for i in out_ids[1:])
    return time.perf_counter() - start, text
  (short, text), (long, long_text) = run(tok.encode("Once upon a time")), run(tok.encode("Once upon a time " * 10_000))
  assert long_text == text == tok.hf.decode(out_ids) and long < 3 * short + 0.02, (short, long)

def test_reference_output_text_in_context():
  tok, ref = Tokenizer(str(STORIES)), json.loads((DATA / "reference.json").read_text())
  for case in ref["cases"]:
    assert tok.encode(case["prompt"]) == case["prompt_token_ids"]
    det, deltas = _deltas(tok, case["prompt_token_ids"], case["output_token_ids"], [1] * len(case["output_token_ids"]))
    assert "".join(deltas) == case["output_text_in_context"]
    assert tok.hf.decode(case["output_token_ids"]) == case["output_text"]
  # at least one recorded case shows the difference: sentencepiece drops the leading space of a text's first token
  assert any(c["output_text"] != c["output_text_in_context"] for c in ref["cases"])

def test_invalid_utf8_in_context_never_fails_the_detokenizer():
  """Random token ids (a benchmark's prompts, or a model's garbage) put broken UTF-8 before a token, which trips DecodeStream's prefix
  check: the detokenizer goes on without that context, as vLLM's does, and what it emits is still the text of the tokens."""
  tok, rng = Tokenizer(str(STORIES)), random.Random(0)
  words = tok.encode(" Once upon a time there was a cat.", add_special_tokens=False)
  for _ in range(100):
    ids = [rng.randrange(3, 512) for _ in range(30)]
    det = tok.detokenizer(ids[:20])
    assert "".join(det(t) or "" for t in ids[20:] + words).endswith("upon a time there was a cat.")

def test_eos_after_output_is_skipped():
  tok = Tokenizer(str(STORIES))
  det = tok.detokenizer(tok.encode("Once upon a time"))
  assert "".join(det(t) or "" for t in tok.encode(" there", add_special_tokens=False)) == " there" and not det(2)

# ---- Hugging Face tokenizer.json: `tokenizers` runs it; our BOS, special-token, EOS and decode rules around it must agree with HF's ----

CORPUS = [c["text"] for f in (DATA / "llama3-tiktoken" / "reference_encodings.json", DATA / "tokenizer_reference.json")
          for c in json.loads(f.read_text())["cases"]] + MULTIBYTE
CORPUS += [c["full_text"] for c in json.loads((DATA / "reference.json").read_text())["cases"]]
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
VARIED = CORPUS + ["", " ", "  two  spaces\n\n\nnewlines\r\n", "numbers 1234567890 3.14159 -42", "CamelCase snake_case kebab-case",
                   "<|begin_of_text|>special <|eot_id|> in text<|end_of_text|>", "e\u0301 decomposed vs é composed", "\t\ttabs\tand 🦙🦙🦙",
                   "def f(x):\n    return {'a': [1, 2]}  # code", "unknown word qwertyuiopzxcv", "I'M SURE THEY'LL SAY IT'S FINE"]
_POOL = list("aeiou tnsrhldAEIOUTN  \n\t\r0123456789.,;:!?'\"-_()[]{}<|>éüßçñ日本語中文🦙👍\u0301\u200d") + ["'s", "'ll", "<|eot_id|>", "  ", "\n\n"]
VARIED += ["".join(random.Random(i).choices(_POOL, k=random.Random(-i).randint(1, 60))) for i in range(300)]  # seeded fuzz strings
# sentencepiece's whitespace rules (dummy prefix, remove_extra_whitespaces) and its own "▁" in the text, special tokens in the text
_SP_POOL = _POOL + ["▁", "▁▁x", "   ", " \n ", "<s>", "</s>", "<unk>", "\u3000", "\xa0"]
FUZZ = VARIED + ["".join(random.Random(i).choices(_SP_POOL, k=random.Random(-i).randint(1, 60))) for i in range(300, 600)]

def _original(name, tok):
  """Encode with the original tokenizer file and its own library: tiktoken for Llama 3, sentencepiece for the others, where (as in HF's
  Llama tokenizers) special-token strings are cut out first and each piece of text between them is encoded alone."""
  if name == "llama3":
    ranks = tiktoken.load.load_tiktoken_bpe(str(DATA / "llama3-tiktoken" / "tokenizer.model"))
    enc = tiktoken.Encoding("llama3", pat_str=LLAMA3_PAT, mergeable_ranks=ranks, special_tokens=tok.specials)
    return lambda text: enc.encode(text, allowed_special="all"), enc.decode
  sp = sentencepiece.SentencePieceProcessor(model_file=str(STORIES_SP if name == "stories" else DATA / "llama2-sentencepiece" / "tokenizer.model"))
  split = re.compile("(<unk>|<s>|</s>)").split  # re.split puts the special tokens at odd indices
  return lambda text: [i for j, p in enumerate(split(text)) for i in ([sp.piece_to_id(p)] if j % 2 else sp.encode(p))], sp.decode

@pytest.mark.parametrize("name", ["llama3", "llama2", "stories"])
def test_matches_sentencepiece_and_tiktoken(folders, name):
  tok = Tokenizer(str(folders[name]))
  encode, decode = _original(name, tok)
  for text in FUZZ:
    assert tok.encode(text, add_special_tokens=False) == (ids := encode(text)), text
    if "▁" not in text:  # sentencepiece drops every leading "▁" piece on decode, HF one space (stories260K/SOURCES.md)
      special = {i for i, token in tok.hf.get_added_tokens_decoder().items() if token.special}
      assert tok.hf.decode(ids) == decode([i for i in ids if i not in special]), text

def test_bundled_tokenizer_json_is_its_conversion(tmp_path):  # tinyvllm/stories260K/SOURCES.md: made by conftest.sentencepiece_to_hf
  sentencepiece_to_hf(STORIES_SP, tmp_path)
  for name in ("tokenizer.json", "tokenizer_config.json"): assert json.loads((tmp_path / name).read_text()) == json.loads((STORIES / name).read_text())

def _train(path, style):
  from tokenizers import Tokenizer as HFTokenizer, Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
  hf = HFTokenizer(models.BPE())
  if style == "llama3":  # Llama 3 / Qwen2 layout: Split regex then ByteLevel without regex, BOS added by a template post-processor
    hf.normalizer = normalizers.NFC()
    hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_PAT), behavior="isolated"),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  else: hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2 layout: ByteLevel's own regex, no BOS
  hf.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  hf.train_from_iterator(CORPUS * 3, trainer)
  hf.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False)] + ([processors.TemplateProcessing(
    single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", hf.token_to_id("<|begin_of_text|>"))])] if style == "llama3" else []))
  path.mkdir(exist_ok=True)
  hf.save(str(path / "tokenizer.json"))
  return hf

@pytest.mark.parametrize("style", ["llama3", "gpt2"])
def test_hf_tokenizer_json_matches_tokenizers(tmp_path, style):
  hf = _train(tmp_path, style)
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|eot_id|>"}))
  tok = Tokenizer(str(tmp_path))
  assert tok.eos_ids == {hf.token_to_id("<|eot_id|>")}
  assert tok.bos_id == (hf.token_to_id("<|begin_of_text|>") if style == "llama3" else None)
  for text in VARIED:
    enc = hf.encode(text)
    assert tok.encode(text) == enc.ids, text
    assert tok.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False).ids, text
    assert tok.hf.decode(enc.ids) == hf.decode(enc.ids, skip_special_tokens=True), text

# ---- chat templates, checked against transformers ----

LLAMA3_TEMPLATE = json.loads((DATA / "llama3-tiktoken" / "tokenizer_config.json").read_text())["chat_template"]
CHATML_TEMPLATE = ("{%- for message in messages %}\n  {%- if loop.first and message.role != 'system' %}\n"
                   "<|start_header_id|>system\nYou are helpful.<|eot_id|>\n  {%- endif %}\n"
                   "  {%- if message.role not in ['system', 'user', 'assistant', 'tool'] %}\n"
                   "{{ raise_exception('bad role ' + message.role) }}{% endif %}\n"
                   "<|start_header_id|>{{ message.role }}\n{{ message.content }}{{ eos_token }}\n"
                   "  {%- if loop.index >= 3 %}{% break %}{% endif %}\n{%- endfor %}\n"
                   "{%- if add_generation_prompt %}\n<|start_header_id|>assistant\n{% endif %}")
CHATS = [[{"role": "user", "content": "Hi!"}],
         [{"role": "system", "content": "  Be brief. "}, {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
          {"role": "user", "content": "And 日本語 🦙?"}],
         [{"role": "user", "content": "Weather in Zürich?"}, {"role": "assistant", "tool_calls": [{"type": "function", "function": {
           "name": "get_weather", "arguments": {"city": "Zürich", "unit": "<°C & co>"}}}]}, {"role": "tool", "content": "sunny"}]]

@pytest.mark.parametrize("template", [LLAMA3_TEMPLATE, CHATML_TEMPLATE], ids=["llama3", "chatml"])
def test_chat_template_matches_transformers(tmp_path, template):
  from transformers import AutoTokenizer
  _train(tmp_path, "llama3")
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template,
                                                              "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}))
  tok, hf = Tokenizer(str(tmp_path)), AutoTokenizer.from_pretrained(str(tmp_path))
  for chat in CHATS:
    for gen in (True, False):
      # HF encodes the rendered chat without special tokens; encode_chat adds BOS only where the template has not emitted it already
      hf_ids = list(hf.apply_chat_template(chat, tokenize=True, add_generation_prompt=gen, return_dict=True)["input_ids"])
      ids, added = tok.encode_chat(chat, add_generation_prompt=gen), [] if template is LLAMA3_TEMPLATE else [tok.bos_id]
      assert ids == added + hf_ids and ids[0] == tok.bos_id and tok.bos_id not in ids[1:]
      # the rendered text itself (byte-level BPE decodes to exactly what it encoded)
      assert tok.hf.decode(ids[len(added):], skip_special_tokens=False) == hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
  if template is CHATML_TEMPLATE:
    with pytest.raises(jinja2.exceptions.TemplateError, match="bad role"): tok.encode_chat([{"role": "robot", "content": "x"}])

def test_chat_content_parts_and_fallback(folders):
  tok = Tokenizer(str(folders["llama3"]))
  parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url", "image_url": {}}, {"type": "text", "text": "there"}]}]
  assert tok.encode_chat(parts) == tok.encode_chat([{"role": "user", "content": "Hi\nthere"}])
  ids = tok.encode_chat([{"role": "user", "content": "Hi!"}])
  assert ids[:2] == [128000, 128006] and ids[-5:] == [128009, 128006, 78191, 128007, 271]  # assistant header follows the user turn
  base = Tokenizer(str(STORIES))  # no chat template: contents joined by newlines, encoded with BOS
  msgs = [{"role": "system", "content": "Once upon a time"}, {"role": "user", "content": [{"type": "text", "text": "there was"}]}]
  assert base.encode_chat(msgs) == base.encode("Once upon a time\nthere was")

def test_chat_template_file_and_eos_union(tmp_path):
  _train(tmp_path, "llama3")
  (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}")
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}}))
  (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 3]}))
  (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
  tok = Tokenizer(str(tmp_path))
  ids = tok.encode_chat([{"role": "user", "content": "a"}])   # the template writes BOS: encode_chat adds none
  assert tok.hf.decode(ids, skip_special_tokens=False) == "<|begin_of_text|>a<|eot_id|>" and ids.count(tok.bos_id) == 1
  assert tok.eos_ids == {1, 2, 3, tok.specials["<|eot_id|>"]}

def test_missing_or_unknown_tokenizer(tmp_path):
  with pytest.raises(FileNotFoundError, match=str(tmp_path)): Tokenizer(str(tmp_path))
  (tmp_path / "tokenizer.model").write_bytes(STORIES_SP.read_bytes())  # sentencepiece only: the error says how to convert it
  with pytest.raises(FileNotFoundError, match=re.escape(f"no tokenizer.json in {tmp_path}: ") + ".*from_pretrained.*save_pretrained"):
    Tokenizer(str(tmp_path))
  (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "WordPiece", "vocab": {}}, "pre_tokenizer": {"type": "BertPreTokenizer"}}))
  with pytest.raises(ValueError, match=str(tmp_path)): Tokenizer(str(tmp_path))
