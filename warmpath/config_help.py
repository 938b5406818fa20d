"""A config field's help text, read from its comment in warmpath/config.py: the one description of
each setting, which `warmpath serve --help` and the other commands print."""

from __future__ import annotations

import dataclasses
import inspect
import io
import tokenize


def field_docs(cls) -> dict[str, str]:
    """Each field's comment, the one description of a setting (CLI help reads it): the comment at
    the end of the field's line, else the comment lines right above it. Inherited fields keep their
    base class's comment."""
    docs: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        lines = inspect.getsource(klass).splitlines()
        above: list[str] = []
        for tok in tokenize.generate_tokens(io.StringIO("\n".join(lines)).readline):
            if tok.type == tokenize.COMMENT and lines[tok.start[0] - 1].lstrip().startswith("#"):
                above.append(tok.string.lstrip("# ").rstrip())
            elif tok.type == tokenize.NAME and tok.start[1] == 4 and _is_field(
                    lines[tok.start[0] - 1], tok.string):
                trailing = _trailing_comment(lines[tok.start[0] - 1])
                docs[tok.string] = trailing or " ".join(above)
                above = []
            elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT,
                                  tokenize.DEDENT):
                if tok.start[1] == 4:
                    above = []
    return {f.name: docs.get(f.name, "") for f in dataclasses.fields(cls)}


def _is_field(line: str, name: str) -> bool:
    return line.startswith(f"    {name}:")


def _trailing_comment(line: str) -> str:
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, IndentationError):
        return ""
    return next((t.string.lstrip("# ").rstrip() for t in toks if t.type == tokenize.COMMENT), "")
