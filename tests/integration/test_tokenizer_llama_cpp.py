"""The bundled model's tokenizer gives llama.cpp's ids and round-trips real source byte-exactly."""

import json
import sysconfig
from pathlib import Path
from pathlib import Path as _P

DATA = _P(__file__).parents[1] / "data"


def test_ids_identical_to_llama_cpp(smollm2_fp32):
    tok = smollm2_fp32.get_tokenizer()
    cases = json.loads((DATA / "tokenizer_cases.json").read_text())["cases"]
    assert len(cases) >= 300
    mismatches = [c["name"] for c in cases if tok.encode(c["text"]) != c["ids"]]
    assert mismatches == []


def test_roundtrip_real_source(smollm2_fp32):
    tok = smollm2_fp32.get_tokenizer()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))[:60] + sorted((stdlib / "email").glob("*.py"))
    texts = [f.read_text(encoding="utf-8") for f in files]
    texts += [
        "π ≈ 3.14159 # ünïcødé — 日本語のコメント 🙂🚀\n",
        "\tif a:\r\n\t\treturn b\r\n",
        "x = " + "a" * 5000 + "\n",  # a long line
        " " * 200 + "\n\n\n" + "\t" * 30,
    ]
    bad = [i for i, t in enumerate(texts) if tok.decode(tok.encode(t)) != t]
    assert bad == []


def test_digits_split_one_by_one(smollm2_fp32):
    tok = smollm2_fp32.get_tokenizer()
    cases = {c["name"]: c for c in json.loads((DATA / "tokenizer_cases.json").read_text())["cases"]}
    assert cases["tricky1"]["text"] == "\n        0x1F"
    assert tok.encode(cases["tricky1"]["text"]) == cases["tricky1"]["ids"]
    assert len(tok.encode("1234567890")) == 10
