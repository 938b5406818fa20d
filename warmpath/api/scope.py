"""Completion scope: where a fill-in-the-middle answer ends, decided on its text as it streams.

Instruct code models seldom emit an end token in a hole: after the missing code they run on, writing
the code after the cursor again, repeating lines, leaving the block. An editor that inserts the
answer as it is (Zed, llama.vim, a raw OpenAI client) inserts all of that, and every token past the
end of the code is decode time taken from the next keystroke. So the server ends the answer where
the code ends; each rule (RULES) cuts before the first line it matches, and the request is aborted
there (the tokens not generated are the saving). The rules and the scopes, precisely:
docs/editors.md, "The rules, as the code applies them". Text is held back only while a rule could
still cut it, so an answer still streams token by token. Pure text: a ScopeCutter sees the prefix
(up to the cursor), the suffix and the answer's text deltas, nothing else.
"""

from __future__ import annotations

import typing

from warmpath.api.code_lines import CLOSERS, CONTINUES, OPENERS, indent, indent_step, unbalanced
from warmpath.config import CompletionScope

SCOPES = typing.get_args(CompletionScope)
RULES = ("line", "suffix", "dedent", "statement", "repeat", "gap", "body")
REPEAT_LINES = 8  # the longest block whose repetition ends an answer
SUFFIX_LINES = 5  # the suffix's lines an answer must not write again
REPEAT_MIN_CHARS = 12  # a block shorter than this can be real code twice, never three times
def resolve(scope: str, prefix: str, suffix: str) -> str:
    """The scope a request gets: "auto" and "statement" are "line" after typed code on the cursor's
    line, else "block" and "statement"."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    if scope not in ("auto", "statement"):
        return scope
    typed = prefix[prefix.rfind("\n") + 1:].strip()
    return "line" if typed else "block" if scope == "auto" else "statement"


class ScopeCutter:
    """A cutter (api/cutters.py's interface): feed(delta, final) -> the text released; `cut` once a
    rule ended the answer, `rule` naming it."""

    def __init__(self, prefix: str, suffix: str, scope: str = "auto"):
        resolved = resolve(scope, prefix, suffix)
        self.request = (prefix, suffix, scope)
        # "statement" is "block" and one more rule
        self.mode = "block" if resolved == "statement" else resolved
        self.cursor_line = prefix[prefix.rfind("\n") + 1:]  # the cursor's line up to the cursor
        after, _, below = suffix.partition("\n")
        self.after = after.strip()  # the code after the cursor on its line
        # ... comes after a space: a repeated one goes with it
        self.space_after = after[:1] in (" ", "\t")
        # the suffix's first line: the cursor's when code follows the cursor, else the first one
        # below it with code
        lines = [self.cursor_line + after] if after.strip() else []
        self.target = next((line.rstrip() for line in [*lines, *below.split("\n")] if line.strip()),
                           "")
        blank = not self.cursor_line.strip()
        # the cursor before code: lines go in above it
        self.keep_newline = blank and bool(self.after)
        opener = not blank and self.cursor_line.rstrip().endswith(OPENERS)
        # Lines less indented than `base` leave the block; None: set by the first non-blank line
        # written.
        self.base: int | None = None if blank else indent(self.cursor_line) + (1 if opener else 0)
        self.closer_indent = indent(self.cursor_line) if opener else None
        code_below = [line for line in below.split("\n") if line.strip()]
        # Line scope at the end of typed code: a line the answer makes open a block goes on into the
        # block when the block is empty in the file (no code below is indented under the cursor's
        # line).
        self.may_open = scope in (
            "auto", "statement") and resolved == "line" and not self.after and not (
                code_below and indent(code_below[0]) > indent(self.cursor_line))
        self.statement = resolved == "statement" or (scope == "statement" and self.may_open)
        # At the end of a complete line (nothing after the cursor, no opener), an answer that starts
        # with a newline is the next lines: scoped as on a blank line below, as tabby-agent's block
        # scope at a line's end.
        self.may_go_below = self.may_open and not self.cursor_line.rstrip().endswith(OPENERS)
        # that blank line's scope, once the answer went there
        self.below_scope: ScopeCutter | None = None
        # A blank line ends the answer, unless the answer is the body of an empty block (the line
        # above the cursor opens a block with no code under it yet): a body may hold blank lines.
        above = next((line for line in reversed(prefix.split("\n")[:-1]) if line.strip()), "")
        self.gap_ends = not (blank and above.rstrip().endswith(OPENERS) and not (
            code_below and indent(code_below[0]) > indent(above)))
        # The statement rule's evidence, the indentation of the code under the cursor's line; None:
        # the rule is off.
        self.below_indent = indent(code_below[0]) if code_below and self.statement else None
        # The body rule's: on a blank cursor line, a first line that opens a block whose body is the
        # code below it (one indentation step deeper: the file's own step)
        self.code_below_indent = indent(code_below[0]) if code_below and blank else None
        self.step = indent_step(prefix)
        # The suffix's next lines long enough to be telling: the answer writing one again has
        # reached code that is already there (the model skipped a line of it, or rewrote the one
        # before).
        self.below = {
            line.rstrip()
            for line in code_below[:SUFFIX_LINES] if len(line.strip()) >= REPEAT_MIN_CHARS
        }
        # The statement rule's line: the cursor's (not blank, opening nothing), else the first line
        # written (after an opener: in the block it opens); None until written. Whether it opens a
        # bracket (its closer is kept).
        self.statement_indent: int | None = None if blank or opener else indent(self.cursor_line)
        self.statement_opens: bool | None = None
        self.depth = 0  # brackets the statement's lines left open
        self.text = ""  # the answer so far, cut or not
        self.sent = 0  # characters of it released
        # characters of it never released: leading blank lines on a blank cursor line
        self.start = 0
        self.line_start = 0  # where the current line begins in text
        self.first = True  # the current line is the cursor's (its start is the prefix's)
        # the current line shows a character after its indentation
        self.shown = bool(self.cursor_line.strip())
        # the answer's complete non-blank lines (rules apply to them), with indentation
        self.seen: list[str] = []
        # each one's hold point: the end of the non-blank line before it
        self.seen_from: list[int] = []
        # the end of the last non-blank line's text (before its newline); 0: the cursor's
        self.content_end = 0
        # the current line closes a block: the answer ends after it (the rule)
        self.closing: str | None = None
        self.held_lines = 0  # complete lines held back: the start of a possible repetition
        self.cut = False
        self.rule: str | None = None

    # -- feeding -----------------------------------------------------------------------------------
    def feed(self, delta: str, final: bool = False) -> str:
        if self.below_scope is None and self.may_go_below and not self.text and delta.startswith(
                "\n"):
            prefix, suffix, scope = self.request
            self.below_scope = ScopeCutter(prefix + "\n", suffix, scope)
            self.text, delta = "\n", delta[1:]
        if self.below_scope is not None:
            return self._feed_below(delta, final)
        if self.cut or self.mode == "none":
            return "" if self.cut else delta
        for ch in delta:
            self.text += ch
            if ch == "\n":
                self._line_end(len(self.text) - 1)
                self.shown = False
            elif not self.shown and ch not in " \t":
                self.shown = True  # the current line's first character after its indentation
                if not self.first:
                    self._first_char()
                elif self.base is None:
                    # a blank cursor line: its first line written sets the block
                    self.base = self.statement_indent = indent(self.cursor_line +
                                                                self._line_text())
            if self.cut:
                return self._release(self.cut_at)
        if final:
            return self._finish()
        return self._release(self._safe())

    def _feed_below(self, delta: str, final: bool) -> str:
        """The answer went on below a complete line: its newline is released with the first text
        after it."""
        below = self.below_scope
        out = below.feed(delta, final)
        self.cut, self.rule = below.cut, below.rule
        if out and not self.sent:
            out, self.sent = "\n" + out, 1
        return out

    def _line_text(self) -> str:
        return self.text[self.line_start:]

    def _release(self, end: int) -> str:
        begin = max(self.sent, self.start)
        out = self.text[begin:max(begin, end)]
        self.sent = max(begin, end)
        return out

    def _stop(self, rule: str, hold_from: int) -> None:
        """Cut before the line whose hold point (the end of the non-blank line before it) is
        `hold_from`."""
        if self.keep_newline and hold_from:
            hold_from = self.text.find("\n", hold_from) + 1 or hold_from
        self.cut, self.rule, self.cut_at = True, rule, hold_from

    # -- the rules ---------------------------------------------------------------------------------
    def _first_char(self) -> None:
        """A new line shows its indentation: the dedent and statement rules decide now (no token of
        that line is needed)."""
        if self.mode != "block":
            return
        line = self._line_text()
        width = indent(line)
        if self.start == self.line_start and not self.seen:
            # the answer's first line after dropped blank lines
            # ... starts on the cursor's line, at its indentation
            self.start += min(width, len(self.cursor_line))
        if self.base is None:
            # a blank cursor line and a blank first line: the first line written sets the block
            self.base = width
        elif width < self.base:
            if self.closer_indent is not None and width == self.closer_indent and line.lstrip(
            ).startswith(CLOSERS):
                # the opened block's closing line: kept, and the answer ends after it
                self.closing = "dedent"
                return
            self._stop("dedent", self.content_end)
            return
        if self.statement_indent is None:  # this line starts the answer's statement
            self.statement_indent = width
            return
        if self.below_indent is None or self.below_indent < self.statement_indent or self.depth > 0:
            return  # the end of a block (the answer may go on), or inside the statement's brackets
        if width > self.statement_indent and self.below_indent == self.statement_indent:
            # a line inside the statement (when the code below is deeper, it is the statement's own
            # body)
            return
        if width == self.statement_indent and self.statement_opens and line.lstrip().startswith(
                CLOSERS):
            self.closing = "statement"  # the statement's closing bracket
            return
        self._stop("statement", self.content_end)

    def _line_end(self, newline: int) -> None:
        line = self.text[self.line_start:newline]
        whole = self.cursor_line + line if self.first else line
        # a line of its own, not the cursor's end
        starts_here = not self.first or not self.cursor_line.strip()
        first, self.first, self.line_start = self.first, False, newline + 1
        if self.mode == "line":
            if first and self.may_open and whole.rstrip().endswith(OPENERS):
                self._open_block()  # the line opens an empty block: its body is the answer's
                self.content_end = newline
                return
            self._stop("line", self._trim_after(newline))
            return
        if self.closing:
            if self.target and whole.rstrip() == self.target:  # the suffix closes the block already
                self._stop("suffix", self.content_end)
            else:
                self._stop(self.closing, newline)  # after the closing line
            return
        if not whole.strip():
            wrote = self.seen or (first and self.cursor_line.strip())
            if wrote and self.gap_ends:
                self._stop("gap", self.content_end)  # a blank line after code: one group of lines
            elif not wrote and not self.cursor_line.strip():
                # leading blank lines on a blank cursor line are never shown
                self.start = self.line_start
            return
        if self.statement_indent is not None:  # a line of the answer's statement
            if self.statement_opens is None:
                self.statement_opens = whole.rstrip().endswith(("{", "(", "["))
            self.depth += sum(map(whole.count, "([{")) - sum(map(whole.count, ")]}"))
        hold_from, self.content_end = self.content_end, newline
        if starts_here:
            rejoined = whole.rstrip() in self.below and self.sent <= hold_from and not (
                # a line under a header is its body, not the suffix's
                self.seen and self.seen[-1].endswith(OPENERS))
            if (self.target and whole.rstrip() == self.target) or rejoined:
                self._stop("suffix", hold_from)
                return
            if not self.seen and self._body_below(whole):
                # the block it opens is the code below: this line is the answer
                self._stop("body", newline)
                return
            self.seen.append(whole.rstrip())
            self.seen_from.append(hold_from)
            held = self._repetition()
            if self.cut:
                return
            self.held_lines = held
        if self._statement_complete(whole):
            self._stop("statement", newline)

    def _body_below(self, line: str) -> bool:
        """The answer's first line, on a blank cursor line, opens a block whose body is already
        below the cursor (the code there is indented under it): that line alone completes the
        code."""
        return self.code_below_indent is not None and line.rstrip().endswith(OPENERS) and \
            self.code_below_indent == indent(line) + self.step

    def _open_block(self) -> None:
        """Line scope goes on into the empty block the cursor's line opens: its body, then its
        closing line."""
        self.mode, self.gap_ends = "block", False
        self.base = indent(self.cursor_line) + 1
        self.closer_indent = indent(self.cursor_line)
        self.statement_indent = None  # the body's first line starts the statement (statement scope)

    def _statement_complete(self, line: str) -> bool:
        """Inside existing code, has the answer's statement ended with this line (no line below can
        belong to it)? Its brackets are closed and the line does not go on; when the code below is
        its body, at once."""
        if (self.statement_indent is None or self.below_indent is None
                or self.below_indent < self.statement_indent):
            return False
        if self.depth > 0:
            return False
        return self.below_indent > self.statement_indent or not line.rstrip().endswith(CONTINUES)

    def _repetition(self) -> int | None:
        """Cuts when the last k lines repeat the k before them; otherwise the number of last lines
        to hold (the longest start of a repetition still possible)."""
        seen, longest = self.seen, 0
        for k in range(1, REPEAT_LINES + 1):
            for m in range(min(k, len(seen) - k), 0, -1):
                if seen[-m:] == seen[-m - k:-k]:
                    if m < k:
                        longest = max(longest, m)
                    elif sum(len(s.strip())
                             for s in seen[-k:]) >= REPEAT_MIN_CHARS or seen[-k:] == seen[-3 *
                                                                                          k:-2 * k]:
                        self._stop("repeat", self.seen_from[-k])
                        return None
                    break
        return longest

    def _trim_after(self, end: int) -> int:
        """Line scope: where the line ends, less the code after the cursor if the model wrote it
        again, whole or its start (see _overlap), and the space before it when the file has one
        there."""
        line = self.text[:end].rstrip()
        repeated = len(
            self.after) if self.after and line.endswith(self.after) else self._overlap(line)
        cut = len(line) - repeated
        # the repeated text is the file's, unless the line needs it to balance its brackets (`f(g(`
        # + `x)` + `)`)
        if not repeated or unbalanced(self.cursor_line + line[:cut] + self.after) > unbalanced(
                self.cursor_line + line + self.after):
            return end
        return len(line[:cut].rstrip()) if self.space_after else cut

    def _overlap(self, line: str) -> int:
        """How much of the start of the code after the cursor the answer's line ends with, when that
        code starts with a closing bracket (`format(parsed)` + `);`)."""
        if not self.after.startswith(CLOSERS):
            return 0
        return next((k for k in range(len(self.after), 0, -1) if line.endswith(self.after[:k])), 0)

    # -- what can be released ----------------------------------------------------------------------
    def _safe(self) -> int:
        """How much of the text no rule can cut any more."""
        if self.mode == "line":
            if not self.after:
                return len(self.text)
            # it may be the code after the cursor written again
            end = len(self.text.rstrip()) - len(self.after)
            # ... with the space before it
            return len(self.text[:end].rstrip()) if self.space_after else end
        safe = len(self.text)
        if self.held_lines:
            safe = self.seen_from[-self.held_lines]
        line = self._line_text()
        if self.first and self.cursor_line.strip():
            return safe  # the cursor line's own end: no rule reads it
        if not line.strip() or self._may_match(self.cursor_line + line if self.first else line):
            return min(safe, self.content_end)
        return safe

    def _may_match(self, partial: str) -> bool:
        """Could the current line still become the suffix's line or repeat a recent line?"""
        if self.target and self.target.startswith(partial):
            return True
        if any(line.startswith(partial) for line in self.below):
            return True
        return any(s.startswith(partial) for s in self.seen[-REPEAT_LINES:])

    def _finish(self) -> str:
        """The model ended (an end token, a stop string, the token limit): the last line is
        complete."""
        if self.mode == "line":
            end = self._trim_after(len(self.text))
            self.cut = self.cut or end < len(self.text.rstrip())
            self.rule = "line" if self.cut else None
            return self._release(end)
        line = self._line_text()
        if line.strip() and not self.closing and (not self.first or not self.cursor_line.strip()):
            if self.target and (self.cursor_line +
                                line if self.first else line).rstrip() == self.target:
                self._stop("suffix", self.content_end)
                return self._release(self.cut_at)
        return self._release(len(self.text))
