from setuptools import setup, find_packages

setup(
  name="tinyvllm",
  version="0.1.0",
  description="A vLLM-style LLM serving engine on tinygrad in at most 1000 lines",
  long_description=open("README.md", encoding="utf-8").read(),
  long_description_content_type="text/markdown",
  packages=find_packages(include=["tinyvllm", "tinyvllm.*"]),
  package_data={"tinyvllm": ["stories260K/*"]},  # the bundled default model ships with the package
  include_package_data=True,
  python_requires=">=3.10",
  install_requires=["tinygrad==0.14.0", "safetensors", "tiktoken", "sentencepiece", "starlette", "uvicorn", "jinja2", "numpy"],
  extras_require={"test": ["pytest", "hypothesis", "torch==2.13.0", "transformers", "openai", "httpx"]},
)
