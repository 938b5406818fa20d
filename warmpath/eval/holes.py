"""Where the real-repository set puts the cursor: holes cut in real files, chosen deterministically,
found with a real parser (tree-sitter's grammars for Python, JavaScript, TypeScript, Go and Rust).

Kinds of hole (what is missing, the middle; the cursor is where it starts):
- line-rest: the rest of a line after typed code (the cursor after a token of the line, not its
  first);
- line: a whole line (the cursor after its indentation, as an editor's auto-indent leaves it);
- lines: 2-4 lines (the cursor after the first one's indentation);
- SAFIM's syntax-aware kinds: call-args (a call's arguments, on one line: the cursor after its
  opening bracket), block-body (a block's statements, 2-8 lines: the cursor at the first one),
  condition (an if's or while's condition, on one line).
A line in or beside a comment, or inside a string of several lines (docstrings), holds no hole: what
an exact match of those means is not code.

The cross-file slice: holes whose middle uses a name defined in another file of the same project and
nowhere in its own file, asked without and with that file as repository context (what the context
buys)."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import cache

from warmpath.eval.corpus import SourceFile

KINDS = ("line-rest", "line", "lines", "call-args", "block-body", "condition")
# Holes of each kind cut in one file (fewer where a file has fewer places of that kind).
PER_FILE = {"line-rest": 3, "line": 2, "lines": 2, "call-args": 2, "block-body": 2, "condition": 1}
MIN_ROW = 8  # a hole has lines of its file above it
CROSS_FILE_PER_PROJECT = 4
CONTEXT_LINES = 120  # the lines of the defining file given as context: around the definition
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

CALLS = {"python": ("call", "argument_list"), "javascript": ("call_expression", "arguments"),
         "typescript": ("call_expression", "arguments"), "go": ("call_expression", "argument_list"),
         "rust": ("call_expression", "arguments")}
BLOCKS = {
    "python": ("block", ), "javascript": ("statement_block", ), "typescript": ("statement_block", ),
    "go": ("block", ), "rust": ("block", )
}
CONDITIONALS = {
    "python": ("if_statement", "elif_clause", "while_statement"),
    "javascript": ("if_statement", "while_statement"),
    "typescript": ("if_statement", "while_statement"), "go": ("if_statement", ),
    "rust": ("if_expression", "while_expression")
}
DEFINITIONS = {
    "python": ("function_definition", "class_definition"),
    "javascript": ("function_declaration", "class_declaration", "variable_declarator"),
    "typescript": ("function_declaration", "class_declaration", "variable_declarator",
                   "interface_declaration", "type_alias_declaration", "enum_declaration"),
    "go": ("function_declaration", "method_declaration", "type_spec", "const_spec", "var_spec"),
    "rust": ("function_item", "struct_item", "enum_item", "trait_item", "type_item", "const_item",
             "static_item", "macro_definition")
}
STRINGS = ("string", "template_string", "raw_string_literal", "interpreted_string_literal",
           "string_literal", "concatenated_string")


@dataclass(frozen=True)
class Hole:
    id: str  # project/path:row:col/kind (lines: and how many), unique in the set
    project: str
    since: int  # the year the project was first published
    language: str
    path: str
    kind: str
    text: str = field(repr=False)  # the whole file
    start: int = 0  # the cursor, a character offset in text
    end: int = 0  # where the middle ends
    # "" the main set; "cross-file" without the defining file, "cross-file+context" with it
    slice: str = ""
    extra: tuple[tuple[str, str], ...] = ()  # repository context: (path, text) of other files

    @property
    def prefix(self) -> str:
        return self.text[:self.start]

    @property
    def middle(self) -> str:
        return self.text[self.start:self.end]

    @property
    def suffix(self) -> str:
        return self.text[self.end:]


@cache
def _parser(language: str):
    from tree_sitter import Language, Parser

    if language == "python":
        import tree_sitter_python as grammar
        return Parser(Language(grammar.language()))
    if language == "javascript":
        import tree_sitter_javascript as grammar
        return Parser(Language(grammar.language()))
    if language == "typescript":
        import tree_sitter_typescript as grammar
        return Parser(Language(grammar.language_typescript()))
    if language == "go":
        import tree_sitter_go as grammar
        return Parser(Language(grammar.language()))
    if language == "rust":
        import tree_sitter_rust as grammar
        return Parser(Language(grammar.language()))
    raise ValueError(f"no grammar for {language!r}")


class Parsed:
    """A file's syntax tree with what hole-finding asks of it, in character offsets (tree-sitter
    counts bytes)."""

    def __init__(self, f: SourceFile):
        self.file, self.text = f, f.text
        data = f.text.encode()
        self.tree = _parser(f.language).parse(data)
        self.lines = f.text.split("\n")
        self.line_start = [0]
        for line in self.lines[:-1]:
            self.line_start.append(self.line_start[-1] + len(line) + 1)
        ascii_only = len(data) == len(f.text)
        self._char = None if ascii_only else self._byte_to_char(data)
        self.bad_rows = self._rows_of_comments_and_long_strings()

    @staticmethod
    def _byte_to_char(data: bytes) -> list[int]:
        out, i = [], 0
        for ch in data.decode():
            out += [i] * len(ch.encode())
            i += 1
        return [*out, i]

    def offset(self, byte: int) -> int:
        return byte if self._char is None else self._char[byte]

    def nodes(self) -> Iterator:
        stack = [self.tree.root_node]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def _rows_of_comments_and_long_strings(self) -> set[int]:
        rows: set[int] = set()
        for node in self.nodes():
            if "comment" in node.type:
                rows.update(range(node.start_point[0], node.end_point[0] + 1))
            elif node.type in STRINGS and node.end_point[0] > node.start_point[0]:
                rows.update(range(node.start_point[0], node.end_point[0] + 1))
        return rows

    def leaves_on(self) -> dict[int, list[int]]:
        """Per row, the character offsets where a leaf token ends (a one-line leaf)."""
        ends: dict[int, list[int]] = {}
        for node in self.nodes():
            if (
                node.child_count == 0
                and node.start_point[0] == node.end_point[0]
                and node.end_byte > node.start_byte
            ):
                ends.setdefault(node.start_point[0], []).append(self.offset(node.end_byte))
        return ends

    def code_start(self, row: int) -> int:
        line = self.lines[row]
        return self.line_start[row] + len(line) - len(line.lstrip(" \t"))

    def row_end(self, row: int) -> int:
        return self.line_start[row] + len(self.lines[row].rstrip())


def _code_line(p: Parsed, row: int) -> bool:
    code = p.lines[row].strip()
    return row >= MIN_ROW and row not in p.bad_rows and bool(code) and any(c.isalnum()
                                                                           for c in code)


def _candidates(p: Parsed, kind: str) -> list[tuple[int, int]]:
    """(start, end) of every place in the file a hole of this kind can go."""
    lang, out = p.file.language, []
    if kind == "line-rest":
        for row, ends in sorted(p.leaves_on().items()):
            if not _code_line(p, row):
                continue
            first_end, end = min(ends), p.row_end(row)
            for cut in sorted(set(ends)):
                rest = p.text[cut:end]
                if first_end <= cut < end and len(rest.strip()) >= 2 and any(c.isalnum()
                                                                             for c in rest):
                    out.append((cut, end))
    elif kind == "line":
        out = [(p.code_start(r), p.row_end(r)) for r in range(len(p.lines))
               if _code_line(p, r) and len(p.lines[r].strip()) >= 3]
    elif kind == "lines":
        for r in range(len(p.lines)):
            for n in (2, 3, 4):
                rows = range(r, r + n)
                if rows[-1] >= len(p.lines) or not all(
                        _code_line(p, x) or not p.lines[x].strip() for x in rows):
                    continue
                if _code_line(p, r) and _code_line(p, rows[-1]):
                    out.append((p.code_start(r), p.row_end(rows[-1])))
    elif kind == "call-args":
        call, args = CALLS[lang]
        for node in p.nodes():
            if node.type != call:
                continue
            a = node.child_by_field_name("arguments")
            if (
                a is None
                or a.type != args
                or a.start_point[0] != a.end_point[0]
                or a.child_count < 3
            ):
                continue
            start, end = p.offset(a.start_byte) + 1, p.offset(a.end_byte) - 1
            inner = p.text[start:end]
            if _code_line(
                    p,
                    a.start_point[0]) and 2 <= len(inner.strip()) <= 100 and inner == inner.strip():
                out.append((start, end))
    elif kind == "block-body":
        for node in p.nodes():
            if node.type not in BLOCKS[lang]:
                continue
            body = [c for c in node.named_children if "comment" not in c.type]
            if lang == "go" and len(body) == 1 and body[0].type == "statement_list":
                body = [c for c in body[0].named_children if "comment" not in c.type]
            if not body:
                continue
            first, last = body[0].start_point[0], body[-1].end_point[0]
            # the row of the line that opens the block (Python's block starts at its first
            # statement)
            opens = (
                node.parent.start_point[0]
                if lang == "python" and node.parent is not None
                else node.start_point[0]
            )
            closes_after = lang == "python" or node.end_point[0] > last
            if not closes_after or first <= opens or not 2 <= last - first + 1 <= 8:
                continue
            if any(r in p.bad_rows for r in range(first, last + 1)) or not _code_line(p, first):
                continue
            if p.offset(body[0].start_byte) != p.code_start(first):
                continue
            out.append((p.code_start(first), p.row_end(last)))
    elif kind == "condition":
        for node in p.nodes():
            if node.type not in CONDITIONALS[lang]:
                continue
            c = node.child_by_field_name("condition")
            if c is not None and c.type == "parenthesized_expression" and c.named_child_count == 1:
                c = c.named_children[0]
            if c is None or c.start_point[0] != c.end_point[0] or not _code_line(
                    p, c.start_point[0]):
                continue
            start, end = p.offset(c.start_byte), p.offset(c.end_byte)
            if len(p.text[start:end].strip()) >= 3:
                out.append((start, end))
    return sorted(set(out))


def _hole(p: Parsed, kind: str, start: int, end: int, slice_: str = "") -> Hole:
    f = p.file
    row = p.text.count("\n", 0, start)
    col = start - p.line_start[row]
    # 2-4 lines from one place
    lines = str(p.text.count("\n", start, end) + 1) if kind == "lines" else ""
    return Hole(f"{f.project}/{f.path}:{row + 1}:{col}/{kind}{lines}", f.project, f.since,
                f.language, f.path, kind, f.text, start, end, slice_)


def file_holes(f: SourceFile, per_file: dict[str, int] = PER_FILE) -> list[Hole]:
    """The file's holes: per kind, `per_file[kind]` of its places drawn with a seed of the file and
    the kind (the same holes on every machine), in the file's order."""
    p = Parsed(f)
    holes = []
    for kind in KINDS:
        places = _candidates(p, kind)
        rng = random.Random(f"{f.project}/{f.path}/{kind}")
        for start, end in sorted(rng.sample(places, min(per_file.get(kind, 0), len(places)))):
            holes.append(_hole(p, kind, start, end))
    return sorted(holes, key=lambda h: (h.start, h.kind))


def definitions(f: SourceFile) -> dict[str, int]:
    """The names a file defines (functions, types, classes, constants...) and the row of each
    definition."""
    p = Parsed(f)
    out: dict[str, int] = {}
    for node in p.nodes():
        if node.type in DEFINITIONS[f.language]:
            name = node.child_by_field_name("name")
            if name is not None and name.type in ("identifier", "type_identifier",
                                                  "property_identifier", "field_identifier"):
                out.setdefault(p.text[p.offset(name.start_byte):p.offset(name.end_byte)],
                               node.start_point[0])
    return out


def cross_file_holes(files: list[SourceFile], others: list[SourceFile],
                     per_project: int = CROSS_FILE_PER_PROJECT) -> list[Hole]:
    """Line and line-rest holes whose middle names something defined in another file of the project
    and nowhere else in its own file: each twice, without that file ("cross-file") and with the
    lines around the definition as repository context ("cross-file+context")."""
    defined: dict[str, tuple[SourceFile, int]] = {}
    for o in others:
        for name, row in definitions(o).items():
            if len(name) >= 4:
                defined.setdefault(name, (o, row))
    found: dict[tuple[str, int], tuple[Hole, SourceFile, int]] = {}  # one hole a line
    for f in files:
        p = Parsed(f)
        for kind in ("line", "line-rest"):
            for start, end in _candidates(p, kind):
                names = [
                    w for w in WORD.findall(p.text[start:end])
                    if w in defined and defined[w][0].path != f.path
                ]
                outside = p.text[:start] + p.text[end:]
                name = next((w for w in names if not re.search(rf"\b{w}\b", outside)), None)
                row = p.text.count("\n", 0, start)
                if name is not None and (f.path, row) not in found:
                    o, at = defined[name]
                    found[(f.path, row)] = (_hole(p, kind, start, end, "cross-file"), o, at)
    rng = random.Random(f"{files[0].project}/cross-file" if files else "")
    picked = sorted(rng.sample(list(found.values()), min(per_project, len(found))),
                    key=lambda x: (x[0].path, x[0].start))
    out = []
    for hole, o, row in picked:
        lines = o.text.split("\n")
        lo = max(0, row - CONTEXT_LINES // 4)
        chunk = "\n".join(lines[lo:lo + CONTEXT_LINES])
        out.append(hole)
        out.append(
            replace(hole, id=hole.id + "+context", slice="cross-file+context",
                    extra=((o.path, chunk), )))
    return out
