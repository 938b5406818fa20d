"""Tokenizer: byte-level BPE built with the `tokenizers` library, from a GGUF vocabulary or a
tokenizer.json.

Special tokens in the text are parsed as special tokens (as llama-server and vLLM do for prompts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

# Texts that end a generation when the model emits them as special tokens (llama.cpp's "end of
# generation").
END_OF_GENERATION_TEXTS = frozenset({
    "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|end|>", "<end_of_turn>",
    "<|EOT|>"
})

# llama.cpp pre-tokenizer names -> a `tokenizers` pre-tokenizer. Byte-level BPE all of them.
_GPT2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| "
    r"?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# DeepSeek-Coder (and DeepSeek LLM 1): regexes applied one after another, each splitting the pieces
# the one before left (llama.cpp's unicode_regex_split, `tokenizers`' Sequence of isolated splits
# alike).
_DEEPSEEK_CODER_REGEXES = (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}")
IGNORE_MERGES = frozenset({"llama-bpe", "llama3"})


def _regex_then_bytes(*regexes: str) -> pre_tokenizers.PreTokenizer:
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in regexes]
    return pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def gguf_pre_tokenizer(name: str) -> pre_tokenizers.PreTokenizer:
    """The `tokenizer.ggml.pre` names we know. `smollm` (and StarCoder's) split digits one by one
    first."""
    if name in ("smollm", "starcoder", "refact", "codeshell"):
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _GPT2])
    if name in ("gpt-2", "gpt2", "default"):
        return _GPT2
    if name == "qwen2":
        return _regex_then_bytes(_QWEN2_REGEX)
    if name in ("llama-bpe", "llama3"):
        return _regex_then_bytes(_LLAMA3_REGEX)
    if name == "deepseek-coder":
        return _regex_then_bytes(*_DEEPSEEK_CODER_REGEXES)
    raise ValueError(f"unsupported GGUF pre-tokenizer {name!r}")


def _byte_chars() -> list[str]:
    """GPT-2's byte-level alphabet: the character that stands for each byte 0..255 in a
    vocabulary."""
    printable = [
        *range(ord("!"),
               ord("~") + 1), *range(ord("¡"),
                                     ord("¬") + 1), *range(ord("®"),
                                                           ord("ÿ") + 1)
    ]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


@dataclass
class Tokenizer:
    """encode(text) -> ids, decode(ids) -> text, plus the special tokens the engine needs."""

    backend: HFTokenizer
    eos_token_id: int | None
    bos_token_id: int | None = None
    add_bos: bool = False
    chat_template: str | None = None
    special_tokens: dict[str, int] = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def stop_token_ids(self) -> frozenset[int]:
        """EOS plus every special token that ends a generation (e.g. both <|endoftext|> and
        <|im_end|>)."""
        ids = {tid for text, tid in self.special_tokens.items() if text in END_OF_GENERATION_TEXTS}
        if self.eos_token_id is not None:
            ids.add(self.eos_token_id)
        return frozenset(ids)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @cached_property
    def token_bytes(self) -> list[bytes | None]:
        """Each id's bytes (byte-level BPE: the vocabulary's characters map back to bytes); None for
        a special token, or for every id of a tokenizer that is not byte-level."""
        if not isinstance(self.backend.decoder, decoders.ByteLevel):
            return [None] * self.vocab_size
        alphabet = "".join(_byte_chars())
        # then latin-1 spells each byte
        back = str.maketrans(alphabet, "".join(map(chr, range(256))))
        special = set(self.special_tokens.values())
        out: list[bytes | None] = [None] * self.vocab_size
        for piece, i in self.backend.get_vocab(with_added_tokens=False).items():
            if i not in special and i < len(out) and not piece.strip(alphabet):
                out[i] = piece.translate(back).encode("latin-1")
        return out

    def token_to_id(self, text: str) -> int | None:
        return self.backend.token_to_id(text)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    @classmethod
    def from_gguf_vocab(
        cls,
        tokens: list[str],
        token_types: list[int],
        merges: list[str],
        pre: str,
        eos_token_id: int | None,
        bos_token_id: int | None,
        add_bos: bool,
        chat_template: str | None,
    ) -> Tokenizer:
        vocab = {tok: i for i, tok in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        # Llama 3's BPE takes a pre-token that is a whole vocabulary entry as it is (llama.cpp:
        # ignore_merges).
        backend = HFTokenizer(
            models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False,
                       ignore_merges=pre in IGNORE_MERGES))
        backend.pre_tokenizer = gguf_pre_tokenizer(pre)
        backend.decoder = decoders.ByteLevel()
        # GGUF token types: 3 = control, 4 = user-defined. Both are matched whole in the text.
        special = {tokens[i]: i for i, t in enumerate(token_types) if t in (3, 4)}
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
        return cls(backend, eos_token_id, bos_token_id, add_bos, chat_template, special)

    @classmethod
    def from_tokenizer_json(
        cls,
        path: str,
        eos_token_id: int | None,
        bos_token_id: int | None,
        add_bos: bool,
        chat_template: str | None,
    ) -> Tokenizer:
        backend = HFTokenizer.from_file(path)
        backend.no_padding()
        backend.no_truncation()
        special = {
            tok.content: tid
            for tid, tok in backend.get_added_tokens_decoder().items() if tok.special
        }
        return cls(backend, eos_token_id, bos_token_id, add_bos, chat_template, special)
