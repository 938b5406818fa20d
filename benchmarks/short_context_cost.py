"""What a request's short context costs the server (warmpath/api/short_context.py): building it
(PromptFitter.short: its lines counted, rendered, tokenized) beside fitting the whole prompt
(PromptFitter.fit), on the event loop, for every FIM request with a deadline. Qwen2.5-Coder's
tokenizer, an editor document of the bench's size (5,000 characters before the cursor, 1,000 after)
cut from a file of this repository, the default short context (128 tokens).

    python benchmarks/short_context_cost.py [--n 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from warmpath.api.fim import Fill, FimFormat, detect_fim
from warmpath.models.registry import load_tokenizer
from warmpath.server.prompt_fitter import PromptFitter

SOURCE = Path(__file__).parents[1] / "warmpath" / "engine" / "scheduler" / "scheduler.py"


async def measure(n: int) -> None:
    tok = load_tokenizer("qwen2.5-coder-0.5b")
    count = lambda text: len(tok.encode(text, add_bos=False))  # noqa: E731  (as served_model.py)
    fitter = PromptFitter(tok, 8192, FimFormat(detect_fim(tok), "anchored", None, count, tok))
    text = SOURCE.read_text()
    fits, shorts = [], []
    for i in range(n):
        cut = 5000 + i % 40  # the cursor moves along a line
        fill = Fill(prefix=text[:cut], suffix=text[cut:cut + 1000])
        t = time.perf_counter()
        whole = await fitter.fit(fill, 16)
        fits.append(time.perf_counter() - t)
        t = time.perf_counter()
        short = await fitter.short(fill, 128, whole)
        shorts.append(time.perf_counter() - t)
    fit_ms = statistics.median(fits) * 1e3
    print(f"whole prompt: {len(whole.ids)} tokens, fitted in p50 {fit_ms:.2f} ms; "
          f"short context: {len(short or [])} tokens, built in p50 "
          f"{statistics.median(shorts) * 1e3:.2f} ms (max {max(shorts) * 1e3:.2f} ms), n={n}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=200)
    asyncio.run(measure(p.parse_args().n))
