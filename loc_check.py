#!/usr/bin/env python3
"""Line budget: code lines in tinyvllm/ (no blanks, comments or docstrings) must stay <= 1000, lines <= 150 chars."""
import ast, os, pathlib, sys, tokenize

MAX_LINES, MAX_WIDTH = 1000, 150
SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}

def docstring_spans(src: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
  spans = []  # (start, end) of each string statement that is the first statement of a module/class/function
  for node in ast.walk(ast.parse(src)):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
      first = node.body[0]
      if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        spans.append(((first.lineno, first.col_offset), (first.end_lineno, first.end_col_offset)))
  return spans

def code_lines(path: pathlib.Path) -> int:
  spans, lines = docstring_spans(path.read_text(encoding="utf-8")), set()
  with path.open("rb") as f:
    for tok in tokenize.tokenize(f.readline):
      if tok.type in SKIP or (tok.type == tokenize.STRING and any(s <= tok.start < e for s, e in spans)): continue
      lines.update(range(tok.start[0], tok.end[0] + 1))
  return len(lines)

def main(root: str = "tinyvllm") -> int:
  files = sorted(p for p in pathlib.Path(root).rglob("*.py") if "__pycache__" not in p.parts)
  if not files: print(f"no .py files under {root}"); return 1
  counts = {p: code_lines(p) for p in files}
  width = max([len(str(p)) for p in files] + [5])
  for p, n in counts.items(): print(f"{str(p):<{width}} {n:>5}")
  too_wide = [f"{p}:{i}: {len(l)} chars > {MAX_WIDTH}" for p in files
              for i, l in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if len(l) > MAX_WIDTH]
  for msg in too_wide: print(msg)
  total = sum(counts.values())
  print(f"TOTAL {total} / {MAX_LINES}")
  return int(total > MAX_LINES or bool(too_wide))

if __name__ == "__main__":
  if len(sys.argv) == 1: os.chdir(pathlib.Path(__file__).resolve().parent)  # count the package beside this script
  sys.exit(main(*sys.argv[1:]))
