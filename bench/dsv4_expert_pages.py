"""Bytes of a ds4 DeepSeek V4 GGUF each decoded token reads: routed experts and the rest.

Usage (from the repo root):

    .venv/bin/python bench/dsv4_expert_pages.py [--gguf FILE] [--experts 8] [--top-k 2] [--tokens 8] [--json]

Without --gguf it writes tiny-dsv4's recipe at width 256 in ds4's layout (routed gate/up
IQ2_XXS, down Q2_K; `--experts`/`--top-k` change the expert count and how many each token
uses) to a temporary file. It prefills a few tokens, then for each of `--tokens` decode steps
evicts the file from the page cache and this process's page tables
(engine/dsv4/residency.py) and decodes one token, then counts the pages of the file mapped
again: those of the routed experts (against the share top-k / experts of their bytes that the
selected experts span) and of everything else (attention, shared expert, router, head: read
whole every token). Also the process's resident set. Linux only (/proc/self/pagemap).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", type=Path)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    from ds4tui.engine.dsv4 import residency
    from ds4tui.engine.dsv4.config import Dsv4Config
    from ds4tui.engine.dsv4.gguf import load_dsv4_gguf
    from ds4tui.engine.dsv4.gguf_write import write_dsv4_gguf
    from ds4tui.engine.dsv4.net import Dsv4Trace
    from ds4tui.engine.dsv4.tiny import CONFIG, SPECIAL_TOKENS, VOCAB, random_tensors
    from ds4tui.engine.text.tiny_tokenizer import train_tiny_tokenizer

    if not residency.available():
        print("needs Linux's /proc/self/pagemap", file=sys.stderr)
        return 1
    tmp = None
    path = args.gguf
    if path is None:
        tmp = tempfile.TemporaryDirectory()
        path = Path(tmp.name) / "tiny-v4-q2.gguf"
        cfg = Dsv4Config.from_hf(dict(CONFIG, hidden_size=256, moe_intermediate_size=256,
                                      n_routed_experts=args.experts, num_experts_per_tok=args.top_k))
        write_dsv4_gguf(path, cfg, random_tensors(cfg), train_tiny_tokenizer(SPECIAL_TOKENS, VOCAB))
    model = load_dsv4_gguf(path, path.stem)
    cfg = model.cfg
    s = model.new_session(min(4096, cfg.max_position_embeddings))
    s.prefill([3, 4, 5, 6])
    rows = []
    for i in range(args.tokens):
        residency.forget_pages(model)
        s.trace = Dsv4Trace()
        s.decode(10 + i)
        banks = residency.expert_pages(model)
        expert = sum(b.mapped for b in banks.values()) * residency.PAGE
        total_expert = sum(b.pages for b in banks.values()) * residency.PAGE
        wrong = sum(1 for (li, w), b in banks.items() if b.experts != set(s.trace.experts[(li, len(s.tokens) - 1)]))
        rows.append({"token": i, "expert_bytes_read": expert, "expert_bytes": total_expert,
                     "other_bytes_read": residency.mapped_bytes(model) - expert, "banks_off_selection": wrong})
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"gguf": str(path), "file_bytes": path.stat().st_size, "layers": cfg.num_hidden_layers,
           "experts": cfg.n_routed_experts, "top_k": cfg.num_experts_per_tok, "max_rss_kb": rss_kb, "tokens": rows}
    if args.json:
        print(json.dumps(out))
    else:
        share = cfg.num_experts_per_tok / cfg.n_routed_experts
        print(f"{path.name}: {out['file_bytes'] / 1e6:.1f} MB, {cfg.num_hidden_layers} layers, "
              f"{cfg.n_routed_experts} experts, top-{cfg.num_experts_per_tok} (selected share {share:.1%}); "
              f"max RSS {rss_kb / 1024:.0f} MB")
        print("| token | routed expert bytes read | of all expert bytes | other bytes read | banks reading an unselected expert |")
        print("|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['token']} | {r['expert_bytes_read']:,} | {r['expert_bytes_read'] / r['expert_bytes']:.1%} | "
                  f"{r['other_bytes_read']:,} | {r['banks_off_selection']} |")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
