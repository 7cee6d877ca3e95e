#!/usr/bin/env python3
"""Copies of the tree with one zero-line variant of attention.in_step_attention each (issue #71), for profiling inside the engine:

  python scripts/instep_variants.py /tmp/var        # makes /tmp/var/{p16,s16,both}/{tinyvllm,scripts}
  python /tmp/var/p16/scripts/profile_decode.py --config llama-3.2-1b --device CUDA --batch 1 --ctx 1024 --prefill --enforce-eager

p16: P realized once in 16 bits (P x V and its float sum read it); s16: the scores written in 16 bits (max and exp in 16 bits); both."""
import os, shutil, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
L97 = ".matmul(k.permute(1, 2, 0).unsqueeze(1), dtype=dtypes.float) / math.sqrt(D)"
L101 = "  m = s.max(-1, keepdim=True); p = (s - m).exp() if gpu else (s - m).exp().contiguous()"
L104 = "  acc = (p.cast(q.dtype) if gpu else p).matmul(v.permute(1, 0, 2).unsqueeze(1), dtype=dtypes.float).contiguous()"
L105 = "to_nh(p.sum(-1, keepdim=True))[..., 0]"

def p16(src:str) -> str:
  src = src.replace(L101, "  m = s.max(-1, keepdim=True); p = ((s - m).exp().cast(q.dtype) if gpu else (s - m).exp()).contiguous()")
  src = src.replace(L104, "  acc = p.matmul(v.permute(1, 0, 2).unsqueeze(1), dtype=dtypes.float).contiguous()")
  return src.replace(L105, "to_nh(p.sum(-1, keepdim=True, dtype=dtypes.float))[..., 0]")

def s16(src:str) -> str: return src.replace(L97, ".matmul(k.permute(1, 2, 0).unsqueeze(1)) / math.sqrt(D)")

if __name__ == "__main__":
  out, src = sys.argv[1], open(os.path.join(ROOT, "tinyvllm", "attention.py")).read()
  assert all(src.count(line) == 1 for line in (L97, L101, L104, L105)), "attention.in_step_attention changed: update the variants"
  for name, variant in {"p16": p16, "s16": s16, "both": lambda s: p16(s16(s))}.items():
    for part in ("tinyvllm", "scripts"):
      shutil.copytree(os.path.join(ROOT, part), os.path.join(out, name, part), ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    open(os.path.join(out, name, "tinyvllm", "attention.py"), "w").write(variant(src))
