"""The bodies llama.vim sends to llama.cpp's /infill, field for field (autoload/llama.vim at
a1c8e6e, github.com/ggml-org/llama.vim), and the file and extra context the server's and the
router's /infill tests send with them."""

import re

LINES = [f"def f{i}(x):\n    return x + {i}\n" for i in range(12)]
FILE = "".join(LINES)
EXTRA = [{
    "text": "class Point:\n    def __init__(self, x, y):\n        self.x = x\n",
    "time": [1722, 51234], "filename": "geometry.py"
}, {
    "text": "import os\nimport sys\n\nROOT = os.path.dirname(__file__)\n", "time": [1722, 61234],
    "filename": "paths.py"
}]
VIM_ACCEPTS = re.compile(r'"content"\s*:"')  # llama.vim's own check: s:fim_on_response


def vim_fim(prefix: str, middle: str, suffix: str, extra: list, first: bool = True,
            indent: int = 4) -> dict:
    """llama#fim's request, g:llama_config at its defaults (n_predict 128, stop_strings [],
    t_max_prompt_ms 500, t_max_predict_ms 1000; 250 for the first request of a position,
    `empty(a:prev)`)."""
    return {
        "id_slot": 0,
        "input_prefix": prefix,
        "input_suffix": suffix,
        "input_extra": extra,
        "prompt": middle,
        "n_predict": 128,
        "stop": [],
        "n_indent": indent,
        "top_k": 40,
        "top_p": 0.90,
        "samplers": ["top_k", "top_p", "infill"],
        "stream": False,
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 250 if first else 1000,
        "response_fields": [
            "content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
            "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
            "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated",
            "tokens_cached"
        ],
    }


def vim_warmup(extra: list) -> dict:
    """s:ring_update's request: only the extra context, n_predict 0 ("no samplers needed here")."""
    return {
        "id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": extra, "prompt": "",
        "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False, "cache_prompt": True,
        "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""]
    }
