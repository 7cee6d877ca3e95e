"""Hugging Face tokenizer.json folders made with transformers from the original tokenizer files in tests/data (Meta's Llama 2
sentencepiece and Llama 3 tiktoken files), once per test session: tinyvllm reads only tokenizer.json, the references stay the originals.
And how pytest-xdist shares the tests out (the README's command runs them on two workers, `-n 2 --dist loadgroup`)."""
import pathlib, shutil
import pytest
from tinygrad.helpers import PARALLEL

DATA = pathlib.Path(__file__).parent / "data"
# tinygrad compiles on a pool of NUM_CPU_THREADS // (xdist workers) processes: under the README's command on 2 cores, one, which the
# worker only waits for, respawned every 16 kernels (BEAM_MAX_TASKS_PER_CHILD). Compiling in the worker itself took 15-25% less CPU time
# (test_model.py and test_moe.py: 104-113 s against 129-139 s). tinygrad internals: PARALLEL is read at each compile
if PARALLEL.value == 1: PARALLEL.value = 0
# the test files whose tests run longest (a minute or more each on 2 cores): first, so that no worker starts one while the other ends
SLOWEST = ["test_startup.py", "test_renderers.py", "test_tensor_parallel.py", "test_moe.py"]

@pytest.hookimpl(tryfirst=True)   # before xdist's own hook, which reads the xdist_group marks
def pytest_collection_modifyitems(items):
  """Under --dist loadgroup, the tests of a file that use the same module-scoped fixtures (a server, an engine, a checkpoint) form one
  group, which one worker runs, so those are built once; every other test goes to whichever worker is free. xdist hands the groups out
  largest first, then the single tests in this order: the slowest files first. (item._fixtureinfo: pytest internals)"""
  items.sort(key=lambda item: SLOWEST.index(item.path.name) if item.path.name in SLOWEST else len(SLOWEST))
  for item in items:
    shared = sorted(name for name, defs in item._fixtureinfo.name2fixturedefs.items() if defs[-1].scope == "module")
    if shared: item.add_marker(pytest.mark.xdist_group(f"{item.path.name}:{'+'.join(shared)}"))

def sentencepiece_to_hf(model_file, out_dir):
  """A sentencepiece BPE model (Llama 2 layout: byte fallback, dummy prefix, <unk> <s> </s>) as a tokenizer.json that encodes exactly as
  sentencepiece does. transformers 5's own conversion (LlamaTokenizer.from_pretrained) misses it twice: it ranks merges by piece id, not
  by score (whitespace pieces like "▁▁" then merge too early), and its Metaspace pre-tokenizer adds no dummy "▁" to a text that already
  starts with a space. So: merges ranked by score (transformers' SentencePieceExtractor) and a normalizer that does what sentencepiece
  does (its add_dummy_prefix, and remove_extra_whitespaces where the model sets it), the layout of the hub's Llama 2 tokenizer.json."""
  import sentencepiece.sentencepiece_model_pb2 as pb
  from tokenizers import Regex, normalizers as N
  from transformers import LlamaTokenizer, PreTrainedTokenizerFast
  from transformers.tokenization_utils_sentencepiece import SentencePieceExtractor
  vocab, _, merges = SentencePieceExtractor(str(model_file)).extract()
  # LlamaTokenizer gives the byte-fallback decoder (which drops the dummy prefix's space) and the "<s> $A" post-processor
  hf = LlamaTokenizer(vocab=vocab, merges=merges, legacy=True, add_bos_token=True).backend_tokenizer
  proto = pb.ModelProto.FromString(pathlib.Path(model_file).read_bytes())
  if proto.normalizer_spec.remove_extra_whitespaces:  # drop leading spaces, one space for a run, no trailing whitespace ("▁" included)
    steps = [N.Replace(Regex(r"\A +"), ""), N.Replace(Regex(" {2,}"), " "), N.Replace(" ", "▁"), N.Prepend("▁"), N.Replace(Regex(r"▁+\z"), "")]
  else: steps = [N.Prepend("▁"), N.Replace(" ", "▁")]
  hf.normalizer, hf.pre_tokenizer = N.Sequence(steps), None
  # PreTrainedTokenizerFast, not LlamaTokenizer, in tokenizer_config.json: transformers 5's LlamaTokenizer would rebuild its own
  # pre-tokenizer on load instead of running this tokenizer.json
  PreTrainedTokenizerFast(tokenizer_object=hf, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(str(out_dir))

def tiktoken_to_hf(folder, out_dir):
  """Llama 3's tiktoken ranks file plus its tokenizer_config.json (special tokens, chat template) as a hub-style tokenizer.json folder:
  transformers' TikTokenConverter splits with Meta's regex, and add_bos_token puts "<|begin_of_text|> $A" in the post-processor."""
  from transformers import AutoTokenizer
  AutoTokenizer.from_pretrained(str(folder), add_bos_token=True).save_pretrained(str(out_dir))

@pytest.fixture(scope="session")
def llama3_dir(tmp_path_factory):
  tiktoken_to_hf(DATA / "llama3-tiktoken", path := tmp_path_factory.mktemp("llama3-hf"))
  return path

@pytest.fixture(scope="session")
def llama2_dir(tmp_path_factory):
  sentencepiece_to_hf(DATA / "llama2-sentencepiece" / "tokenizer.model", path := tmp_path_factory.mktemp("llama2-hf"))
  return path

@pytest.fixture(scope="session")
def llama3_random(tmp_path_factory, llama3_dir):
  """A random-weight Llama with Llama 3's 128k vocabulary, tokenizer.json and chat template (llama3_dir), saved by transformers."""
  import torch, transformers
  path = tmp_path_factory.mktemp("llama3_vocab")
  torch.manual_seed(0)
  cfg = transformers.LlamaConfig(vocab_size=128256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=1, max_position_embeddings=1024, tie_word_embeddings=True, architectures=["LlamaForCausalLM"])
  transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
  shutil.copytree(llama3_dir, path, dirs_exist_ok=True)
  return path
