"""Fill-in-the-middle templates by model family: the layout of a FIM prompt, the family's stop tokens and its
repository-level context. Pure text, shared by the server (which finds the family from its tokenizer's special
tokens) and the router (which renders the prompt itself for an engine that rejects `suffix`, finding the family
from the node's model name)."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

# The anchored layout (prefix-first families): the prompt's prefix ends at a line start a few lines above the
# cursor, and the lines from there to the cursor open the middle, after the middle marker (FIM training splits
# documents anywhere, so a middle that starts with text is the model's own format). Typing then changes nothing
# before the marker: context, prefix, suffix and marker stay in the prefix cache and each keystroke computes only
# the text it added. Which line start: the minimizer of a hash of the last ANCHOR_WINDOW complete lines, so the
# choice depends on the text alone (a request's prompt never depends on the server's state) and moves about once
# every (ANCHOR_WINDOW + 1) / 2 lines as the cursor goes down, each move recomputing the suffix once.
ANCHOR_WINDOW = 24
LAYOUTS = ("anchored", "cursor")  # cursor: the plain layout, the prefix up to the cursor before the suffix
# The suffix a FIM prompt keeps (keep_suffix()): its first lines, as many tokens as this machine computes in
# SUFFIX_MS, and MIN_SUFFIX_TOKENS at least. Every move of the anchor, and every file opened, computes the suffix
# again before the first token, inside an editor's ~300 ms deadline; fewer than MIN_SUFFIX_TOKENS cost more than 2
# points of pass@1 (benchmarks/results/fim_suffix_quality_qwen05_epyc_avx2.json).
SUFFIX_MS = 250.0
MIN_SUFFIX_TOKENS = 64


@dataclass(frozen=True)
class FimTemplate:
    name: str
    tokens: tuple[str, ...]  # special tokens whose presence identifies the family
    layout: str  # "{context}" / "{prefix}" / "{suffix}" placeholders around the special tokens
    # Special tokens that end a completion of this family (a marker the model emits means it left the hole:
    # another file, another hole, padding). They are stop token ids and, spelled out in text, stop strings.
    stops: tuple[str, ...] = ()
    repo_header: str | None = None  # how the family names the repository ("{repo}" placeholder)
    file_sep: str | None = None  # the family's file separator token; None: other files go in as plain text

    @property
    def prefix_first(self) -> bool:
        """Prefix, suffix, then the middle marker (PSM): the text after the marker is the start of the middle."""
        return self.layout.index("{prefix}") < self.layout.index("{suffix}") and self.layout.endswith(self.tokens[-1])

    def build(self, prefix: str, suffix: str, context: str = "", layout: str = "cursor") -> str:
        """The prompt: `context` (repo_context()) where the family reads it, always ahead of the prefix.
        layout "anchored" (prefix-first families): the prefix's last lines after the middle marker (anchor())."""
        if layout not in LAYOUTS:
            raise ValueError(f"FIM layout must be one of {LAYOUTS}, got {layout!r}")
        head = ""
        if layout == "anchored" and self.prefix_first:
            cut = anchor(prefix)
            prefix, head = prefix[:cut], prefix[cut:]
        text = self.layout.replace("{context}", context).replace("{prefix}", prefix).replace("{suffix}", suffix)
        return text + head

    def split(self, prompt: str) -> tuple[str, str] | None:
        """(the text before the cursor, the text after it) of a prompt written in this family's layout with its
        markers (Zed's edit prediction writes the prompt itself): the prefix with, for a prefix-first family, the
        middle's start after the marker; and the suffix. Repository context stays in the prefix. None when the
        prompt does not hold the layout's markers in order."""
        layout = self.layout.replace("{context}", "")
        parts: dict[str, str] = {}
        at = 0
        for name in sorted(("prefix", "suffix"), key=lambda n: layout.index("{" + n + "}")):
            i = layout.index("{" + name + "}")
            before = layout[:i].split("}")[-1]
            after = layout[i + len(name) + 2:].split("{")[0]
            start = prompt.find(before, at)
            if start < 0:
                return None
            start += len(before)
            end = prompt.find(after, start) if after else len(prompt)
            if end < 0:
                return None
            parts[name], at = prompt[start:end], end
        head = prompt[at + len(self.tokens[-1]):] if self.prefix_first and prompt.startswith(self.tokens[-1], at) \
            else ""
        return parts["prefix"] + head, parts["suffix"]


def anchor(prefix: str, window: int = ANCHOR_WINDOW) -> int:
    """Where the anchored layout cuts the prefix: just after one of its last `window` complete lines, the one of
    the lowest CRC-32 of its text with its newline (the latest of equals), 0 when it has no complete line. As
    lines are added below, the choice stays until that line leaves the window or a lower one is completed, and
    it never moves up."""
    best, best_hash, end = 0, None, len(prefix)
    for _ in range(window):
        nl = prefix.rfind("\n", 0, end)
        if nl < 0:
            break
        start = prefix.rfind("\n", 0, nl) + 1
        h = zlib.crc32(prefix[start:nl + 1].encode())  # with its newline: blank lines do not all hash to 0
        if best_hash is None or h < best_hash:  # going up: a strictly lower one wins, so equals keep the latest
            best, best_hash = nl + 1, h
        end = start
        if start == 0:
            break
    return best


def suffix_budget(seconds_per_token: float, block_size: int = 16, ms: float = SUFFIX_MS) -> int:
    """The suffix tokens a prompt keeps on a machine that computes a prompt token in `seconds_per_token`: what it
    computes in `ms`, whole KV blocks of it, MIN_SUFFIX_TOKENS at least."""
    return max(MIN_SUFFIX_TOKENS, int(ms / 1000 / seconds_per_token) // block_size * block_size)


def suffix_tokens(setting: str, seconds_per_token: float, block_size: int = 16) -> int | None:
    """--fim-suffix-tokens read: "auto" suffix_budget() of the measured speed, "all" None (no cut), or a count."""
    if setting == "auto":
        return suffix_budget(seconds_per_token, block_size)
    if setting == "all":
        return None
    if not setting.isdigit():
        raise ValueError(f"--fim-suffix-tokens must be auto, all or a number of tokens, got {setting!r}")
    return int(setting)


def keep_suffix(suffix: str, budget: int, count: Callable[[str], int]) -> str:
    """The suffix's first lines, whole, while their tokens (`count`, line by line) fit `budget`; the first line
    (the rest of the cursor's line) always. A function of the text alone: typing before the suffix never moves
    the cut, so the kept suffix stays in the prefix cache."""
    lines = suffix.splitlines(keepends=True)
    kept, used = lines[:1], count(lines[0]) if lines else 0
    for line in lines[1:]:
        used += count(line)
        if used > budget:
            break
        kept.append(line)
    return "".join(kept)


FIM_TEMPLATES = (
    FimTemplate("qwen2.5-coder", ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
                "{context}<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>",
                ("<|endoftext|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>",
                 "<|repo_name|>", "<|file_sep|>", "<|im_start|>", "<|im_end|>"),
                "<|repo_name|>{repo}\n", "<|file_sep|>"),
    FimTemplate("starcoder", ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
                "{context}<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>",
                ("<|endoftext|>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>", "<file_sep>",
                 "<repo_name>", "<filename>"),
                "<repo_name>{repo}", "<file_sep>"),  # StarCoder2 (StarCoder 1 has no <file_sep>)
    # DeepSeek-Coder reads other files as plain text at the start of the hole's file (its README's form).
    FimTemplate("deepseek-coder", ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
                "<｜fim▁begin｜>{context}{prefix}<｜fim▁hole｜>{suffix}<｜fim▁end｜>",
                ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", "<｜end▁of▁sentence｜>", "<|EOT|>")),
    FimTemplate("codestral", ("[SUFFIX]", "[PREFIX]"), "{context}[SUFFIX]{suffix}[PREFIX]{prefix}",  # suffix first
                ("[PREFIX]", "[SUFFIX]", "[MIDDLE]", "</s>")),
)


@dataclass(frozen=True)
class ContextFile:
    """A file of repository-level context: a path and its text (llama.vim's `input_extra` chunk)."""

    filename: str
    text: str


def repo_context(extra: Sequence[ContextFile | Mapping[str, str]], template: FimTemplate | None,
                 repo: str = "", current_file: str = "") -> str:
    """Other files of the repository as the family's FIM prompt reads them, for FimTemplate.build(context=).

    Sorted by filename (then text), duplicates dropped: the same set of files gives the same bytes however the
    client orders it, so the context, which comes before the prefix, stays in the prefix cache from keystroke to
    keystroke. With a file separator it ends in one (`<|file_sep|>{current}\n` then the FIM marker): its tokens
    never depend on the prefix after it. Special-token strings in the files are read as special, as in the prompt.
    Qwen2.5-Coder: `<|repo_name|>{repo}\n<|file_sep|>{path}\n{text}` per file, then `<|file_sep|>{current}\n`
    (the hole's own file); StarCoder2: `<repo_name>{repo}<file_sep>{path}\n{text}...<file_sep>{current}\n`;
    families without a file separator: `{path}\n{text}` blocks. No repo name: no repository header. No files: ""
    (the plain FIM prompt)."""
    files = sorted({f if isinstance(f, ContextFile) else ContextFile(f.get("filename") or "", f.get("text") or "")
                    for f in extra}, key=lambda f: (f.filename, f.text))
    files = [f for f in files if f.text or f.filename]
    if not files:
        return ""
    body = [f"{f.filename}\n{_ends_line(f.text)}" for f in files]
    if template is None or template.file_sep is None:
        return "".join(body)
    sep = template.file_sep
    head = template.repo_header.replace("{repo}", repo) if template.repo_header and repo else ""
    return head + "".join(sep + b for b in body) + f"{sep}{current_file}\n"


def _ends_line(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


# Model-name fragments (lower case, as hubs name them) of each family: a node that serves "Qwen/Qwen2.5-Coder-7B"
# fills holes the qwen2.5-coder way. Checked in order; the first fragment found wins.
FAMILY_NAMES = (("qwen2.5-coder", "qwen2.5-coder"), ("qwen-coder", "qwen2.5-coder"), ("qwen3-coder", "qwen2.5-coder"),
                ("starcoder", "starcoder"), ("deepseek-coder", "deepseek-coder"), ("codestral", "codestral"))


def fim_for_model(model: str) -> FimTemplate | None:
    """The FIM template of the family a model's name says it belongs to; None for a model of no known family
    (it completes from the prefix alone, as the server does for a model without FIM tokens)."""
    name = model.lower()
    for fragment, family in FAMILY_NAMES:
        if fragment in name:
            return next(t for t in FIM_TEMPLATES if t.name == family)
    return None
