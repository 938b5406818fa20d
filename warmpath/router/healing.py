"""Token healing for the engines that have none (vLLM, SGLang, llama.cpp), done by the router. A FIM
prompt that ends inside a line ends inside a word or just after one, on a token the model rarely saw
there ("self.fo" ends on "fo"), and without healing (engine/healing.py) the model goes on as if that
were the whole word. So the router gives the cursor line's last word back: the prompt ends before
it, in the anchored layout (api/fim.py), and the engine is told to begin its answer with that text
(its own constraint: llama.cpp's grammar, vLLM's and SGLang's regex), so the model writes it in its
own tokens ("fo" + "rmat" or "format"). `Respell` then drops it. Left to itself the model often
writes something else there (silence, measured: docs/benchmarks.md), so an engine that cannot be
constrained is not healed: its prompt keeps the cursor layout.
"""

from __future__ import annotations

# A client's own constraint on the answer: healing would replace it, so such a request is not
# healed.
CLIENT_CONSTRAINTS = ("grammar", "json_schema", "structured_outputs", "regex", "ebnf",
                      "guided_regex", "guided_json", "guided_grammar", "response_format")


def _word(c: str) -> bool:
    return c.isalnum() or c == "_"


def given_back(prefix: str) -> str:
    """The end of the cursor's line that the prompt leaves out: one mark that is not a word's (`(`,
    `.`, `=`), the word before it, and the blanks before that ("" where the cursor is at a line's
    start). `x = self.fo` gives `fo`, `    foo(` gives `    foo(` (the prompt then ends at the
    line's start), `return ` gives ` `."""
    i = len(prefix)
    if i and not _word(prefix[i - 1]) and not prefix[i - 1].isspace():
        i -= 1
    while i and _word(prefix[i - 1]):
        i -= 1
    while i and prefix[i - 1] in " \t":
        i -= 1
    return prefix[i:]


def constraint(kind: str, text: str) -> dict:
    """The body fields that make an engine's answer begin with `text` (EngineKind.start_constraint),
    anything after it allowed."""
    if kind == "grammar":
        return {"grammar": f"root ::= {_gbnf_literal(text)} [^\\x00]*"}
    pattern = "".join("\\" + c if c in _REGEX_SPECIAL else "\\t" if c == "\t" else c
                      for c in text) + "[\\s\\S]*"
    return {"structured_outputs": {"regex": pattern}
            } if kind == "structured_outputs" else {"regex": pattern}


_REGEX_SPECIAL = set("\\.^$*+?{}[]|()")


def _gbnf_literal(text: str) -> str:
    return '"' + "".join("\\" + c if c in '"\\' else c if " " <= c <= "~" else f"\\U{ord(c):08X}"
                         for c in text) + '"'


class Respell:
    """A cutter (api/cutters.py) first in the router's chain: the answer must begin with `text`
    (given_back()), which it drops; any other answer is cut to nothing. Holds back only until
    `text`'s length has arrived."""

    def __init__(self, text: str):
        self.text = text
        self.seen = ""  # the answer so far, while it is shorter than `text`
        self.passed = not text
        self.cut = False

    def feed(self, delta: str, final: bool = False) -> str:
        if self.cut:
            return ""
        if self.passed:
            return delta
        self.seen += delta
        if len(self.seen) < len(self.text):
            self.cut = final or not self.text.startswith(self.seen)
            return ""
        if not self.seen.startswith(self.text):
            self.cut = True
            return ""
        self.passed = True
        return self.seen[len(self.text):]


def respelled(chain) -> str:
    """The text `chain` (a Chain of cutters, or None) expects written again: what the prompt must
    leave out."""
    return next(
        (c.text for c in chain.cutters if isinstance(c, Respell)), "") if chain is not None else ""
