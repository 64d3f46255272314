"""Read a bash script's words as bash does, or say that we cannot.

A small reader for the part of bash that verl launch scripts use: quoting (``'...'``, ``"..."``,
backslashes), line continuations, comments, assignments (``A=1`` for the rest of the script,
``A=1 cmd`` for that command's environment only), ``$A``/``${A}``, the ``${A:-word}`` family
(nested), ``$((arithmetic))``, indexed arrays (``A=(w1 w2 ...)``, ``A+=(...)``, expanded by ``"${A[@]}"``
into one word per element: verl's LoRA and e2e scripts group their overrides so),
``;``/``&&``/``||``/``|`` and redirections. Command substitution
(``$(...)``, backticks) and the rarer expansions are not run: the word is marked *unevaluable*, so
diagnose says "could not evaluate" instead of guessing a value. A variable the script never sets
may come from the caller's environment: the word is marked *unresolved*.

One pass over the text, linear in its length (plain runs of characters are taken by one regex).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from dataclasses import dataclass, field

from grpo_tune.core.errors import ConfigError

_PLAIN = re.compile(r"[^\s'\"\\$`;&|<>()#]+")
_DQ_PLAIN = re.compile(r'[^"\\$`]+')
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\+?=")
_ARRAY_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=\(")
_ARRAY_ALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\[([@*])\]\}")
_ARRAY_WORD = re.compile(r'"?\$\{[A-Za-z_][A-Za-z0-9_]*\[@\]\}"?')
"""A word that is one array's expansion and nothing else: it becomes one word per element."""
_SPECIAL = "@*#?$!-0123456789"
MAX_EXPANSION_CHARS = 1 << 20
"""The longest word an expansion may build (1 MiB; the script itself is at most 4 MiB)."""
MAX_ARRAY_WORDS = 100_000
"""The most elements an array may hold (``A=("${A[@]}" "${A[@]}")`` doubles it)."""
DECLARE = ("export", "declare", "local", "readonly", "typeset")


@dataclass
class Value:
    """Expanded text plus what we could not know."""

    text: str = ""
    unresolved: list[str] = field(default_factory=list)
    """Variables the script does not set (they may come from the caller)."""
    unevaluable: list[str] = field(default_factory=list)
    """Constructs not evaluated (command substitution, ...), as written."""
    literal_dollar: bool = False
    """A ``$`` inside single quotes: bash passes it on unexpanded."""
    caller_args: bool = False
    """``"$@"``/``$*``: the caller's own arguments."""
    elements: list["Word"] | None = None
    """``${A[@]}``: the array's elements (a word that is only this expansion becomes one word per element)."""

    def add(self, other: "Value") -> None:
        if len(self.text) + len(other.text) > MAX_EXPANSION_CHARS:  # X="$X$X" forty times: 2^40 characters
            raise ConfigError(
                f"a word of the script expands past {MAX_EXPANSION_CHARS:,} characters (a variable that doubles "
                "itself?): not read",
                hint="a verl launch's values are short; check the script's assignments",
            )
        self.text += other.text
        self.unresolved += [n for n in other.unresolved if n not in self.unresolved]  # bounded by the names
        self.unevaluable += [n for n in other.unevaluable if n not in self.unevaluable]
        self.literal_dollar |= other.literal_dollar
        self.caller_args |= other.caller_args
        if other.elements is not None:
            self.elements = other.elements


@dataclass
class Word:
    value: Value
    line: int
    raw: str
    start: int = -1
    """Where the word starts in the text read (its opening quote included); -1 when not from the text."""
    end: int = -1
    """Just past the word's last character (a word that spans lines by ``\\``-newline spans them all)."""


@dataclass
class Command:
    words: list[Word]
    assigns: list[tuple[str, Word]]
    line: int
    end: str = "\n"
    """What ended it: newline, ``;``, ``&&``, ``||``, ``|``, ``&`` or end of text."""


class ShellReader:
    def __init__(self, text: str):
        self.s = text
        self.n = len(text)
        self.i = 0
        self.line = 1
        self.env: dict[str, Value] = {}
        self.arrays: dict[str, list[Word]] = {}
        """Indexed arrays the script assigns (``A=(...)``), each element a word as read."""
        self.unclosed: int | None = None
        """The line of a quote that never closes (bash refuses the whole script: a syntax error)."""

    # ------------------------------------------------------------------ low level
    def _peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < self.n else ""

    def _adv(self, k: int = 1) -> str:
        out = self.s[self.i : self.i + k]
        self.line += out.count("\n")
        self.i += k
        return out

    def _matching(self, open_: str, close: str) -> int:
        """Index just past the ``close`` that balances the ``open_`` before ``self.i`` (quotes skipped)."""
        depth, j = 1, self.i
        while j < self.n:
            c = self.s[j]
            if c == "\\":
                j += 2
                continue
            if c == "'":
                k = self.s.find("'", j + 1)
                j = self.n if k < 0 else k + 1
                continue
            if c == '"':
                j += 1
                while j < self.n and self.s[j] != '"':
                    j += 2 if self.s[j] == "\\" else 1
                j += 1
                continue
            if c == open_:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return self.n

    # ------------------------------------------------------------------ expansions
    def _lookup(self, name: str, out: Value) -> None:
        if name in self.env:
            out.add(
                Value(
                    **{
                        **self.env[name].__dict__,
                        "unresolved": list(self.env[name].unresolved),
                        "unevaluable": list(self.env[name].unevaluable),
                    }
                )
            )
        elif name in ("HOME", "PWD", "USER"):
            out.text += "$" + name  # only in paths: left as written, not a finding
        else:
            out.text += "$" + name
            out.unresolved.append(name)

    def _dollar(self, out: Value, quoted: bool) -> None:
        """At ``$``: expand what follows into ``out``."""
        self._adv()
        c = self._peek()
        if c == "(" and self._peek(1) == "(":
            start = self.i - 1
            self._adv(2)
            end = self._matching("(", ")")
            expr = self.s[self.i : end - 1]
            if end < self.n and self.s[end] == ")":
                end += 1
                expr = self.s[self.i : end - 2]
            self._adv(end - self.i)
            val = self._arith(expr)
            if val is None:
                out.text += self.s[start : self.i]
                out.unevaluable.append(self.s[start : self.i])
            else:
                out.text += str(val)
            return
        if c == "(":
            start = self.i - 1
            self._adv()
            end = self._matching("(", ")")
            self._adv(end - self.i)
            out.text += self.s[start : self.i]
            out.unevaluable.append(self.s[start : self.i])
            return
        if c == "{":
            self._adv()
            self._brace(out)
            return
        m = _NAME.match(self.s, self.i)
        if m:
            self._adv(m.end() - self.i)
            self._lookup(m.group(0), out)
            return
        if c and c in _SPECIAL:
            self._adv()
            if c in "@*":
                out.caller_args = True
            else:
                out.text += "$" + c
                out.unresolved.append("$" + c)
            return
        out.text += "$"  # a lone dollar is literal

    def _brace(self, out: Value) -> None:
        """After ``${``: ``NAME``, ``NAME[:][-=+?]word``, ``NAME[@]``/``NAME[*]`` (an array's elements, joined by
        blanks; ``elements`` keeps them apart); anything else is unevaluable."""
        start = self.i - 2
        arr = _ARRAY_ALL.match(self.s, self.i)
        if arr:
            self._adv(arr.end() - self.i)
            name = arr.group(1)
            if name not in self.arrays:  # bash cannot export an array: an unset one is empty, or the caller's mistake
                out.unresolved.append(name)
                return
            items = self.arrays[name]
            for k, w in enumerate(items):
                if k:
                    out.text += " "
                out.add(dataclasses.replace(w.value, elements=None))
            if arr.group(2) == "@":
                out.elements = list(items)
            return
        m = _NAME.match(self.s, self.i)
        op = None
        if m:
            rest = self.s[m.end() : m.end() + 2]
            for cand in (":-", ":=", ":+", ":?", "-", "=", "+", "?", "}"):
                if rest.startswith(cand):
                    op = cand
                    break
        if not m or op is None:
            end = self._matching("{", "}")
            self._adv(end - self.i)
            out.text += self.s[start : self.i]
            out.unevaluable.append(self.s[start : self.i])
            return
        name = m.group(0)
        self._adv(m.end() - self.i + len(op))
        if op == "}":
            self._lookup(name, out)
            return
        word = self._word_until_brace()
        known = name in self.env
        empty = known and self.env[name].text == "" and not self.env[name].unresolved
        use_word = not known or (":" in op and empty)
        if op.endswith("+"):  # alternate value: the word when set
            if known and not (":" in op and empty):
                out.add(word)
            elif not known:
                out.unresolved.append(name)
            return
        if op.endswith("?"):
            if known:
                self._lookup(name, out)
            else:
                out.unresolved.append(name)
            return
        if use_word:
            out.add(word)
            if op.endswith("="):
                self.env[name] = word
        else:
            self._lookup(name, out)

    def _word_until_brace(self) -> Value:
        """The word inside ``${A:-word}`` up to the matching ``}`` (quotes and expansions allowed)."""
        out = Value()
        while self.i < self.n:
            c = self._peek()
            if c == "}":
                self._adv()
                return out
            if c == "\\":
                self._adv()
                out.text += self._adv()
            elif not self._quote_or_expansion(c, out):
                out.text += self._adv()
        return out

    def _quote_or_expansion(self, c: str, out: Value) -> bool:
        """Read the quoted part or expansion that ``c`` starts, outside double quotes, into ``out``; False when
        ``c`` starts none (the same in a word and in ``${A:-word}``)."""
        if c == "'":
            self._single(out)
        elif c == '"':
            self._double(out)
        elif c == "$":
            self._dollar(out, quoted=False)
        elif c == "`":
            self._backtick(out)
        else:
            return False
        return True

    def _arith(self, expr: str) -> int | None:
        """Integer arithmetic as bash's ``$((...))`` does it; None when it holds anything else."""
        unknown = False

        def var(m: re.Match) -> str:
            nonlocal unknown
            v = self.env.get(m.group(1) or m.group(2))
            if v is None or v.unresolved or v.unevaluable:
                unknown = True
                return "0"
            return v.text.strip() or "0"

        text = re.sub(r"\$\{?([A-Za-z_]\w*)\}?|\b([A-Za-z_]\w*)\b", var, expr)
        if unknown or not re.fullmatch(r"[0-9+\-*/%() \t]*", text) or len(text) > 1000:
            return None
        try:
            return _eval_int(ast.parse(text.strip() or "0", mode="eval").body)
        except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
            return None

    def _backtick(self, out: Value) -> None:
        start = self.i
        self._adv()
        while self.i < self.n and self._peek() != "`":
            self._adv(2 if self._peek() == "\\" else 1)
        self._adv()
        out.text += self.s[start : self.i]
        out.unevaluable.append(self.s[start : self.i])

    def _single(self, out: Value) -> None:
        line = self.line
        self._adv()
        end = self.s.find("'", self.i)
        if end < 0:
            self.unclosed = self.unclosed or line
            end = self.n
        chunk = self.s[self.i : end]
        out.text += chunk
        if "$" in chunk:
            out.literal_dollar = True
        self._adv(end - self.i + 1)

    def _double(self, out: Value) -> None:
        line = self.line
        self._adv()
        self.unclosed = self.unclosed or line  # cleared below when the closing quote comes
        opened = self.unclosed == line
        while self.i < self.n:
            c = self._peek()
            if c == '"':
                self._adv()
                if opened:
                    self.unclosed = None
                return
            if c == "\\":
                nxt = self._peek(1)
                if nxt == "\n":
                    self._adv(2)
                elif nxt in ("$", "`", '"', "\\"):
                    self._adv()
                    out.text += self._adv()
                else:
                    out.text += self._adv()
            elif c == "$":
                self._dollar(out, quoted=True)
            elif c == "`":
                self._backtick(out)
            else:
                m = _DQ_PLAIN.match(self.s, self.i)
                out.text += self._adv(m.end() - self.i if m else 1)

    # ------------------------------------------------------------------ words and commands
    def _word(self) -> Word:
        """One word from ``self.i`` (at a non-blank, non-operator character)."""
        start, line = self.i, self.line
        out = Value()
        while self.i < self.n:
            c = self._peek()
            m = _PLAIN.match(self.s, self.i)
            if m:
                out.text += self._adv(m.end() - self.i)
                continue
            if c == "\\":
                nxt = self._peek(1)
                if nxt == "\n":
                    self._adv(2)  # line continuation
                    continue
                self._adv()
                out.text += self._adv()
            elif self._quote_or_expansion(c, out):
                continue
            elif c == "#":
                out.text += self._adv()  # inside a word '#' is literal
            else:
                break
        return Word(out, line, self.s[start : self.i], start, self.i)

    def _finish(self, st: "_Building", end: str) -> Command | None:
        """The command built so far (None when empty); a bare assignment list updates the script's variables."""
        cmd = None
        if st.words or st.assigns:
            if st.words and st.words[0].value.text in DECLARE:
                for w in st.words[1:]:
                    m = _ASSIGN.match(w.value.text)
                    if m:
                        self.env[m.group(1)] = _tail(w.value, len(m.group(0)))
            if not st.words:
                self.env.update(st.pending)
            first = st.words[0] if st.words else st.assigns[0][1]
            cmd = Command(st.words, st.assigns, first.line, end)
        st.words, st.assigns, st.pending = [], [], {}
        return cmd

    def _redirect(self, st: "_Building") -> None:
        """At ``<`` or ``>``: drop the fd number (``2>&1``); a here-document's body is skipped at the newline."""
        if st.words and re.fullmatch(r"\d+", st.words[-1].raw) and self.s[self.i - 1].isdigit():
            st.words.pop()
        if self.s.startswith("<<", self.i):
            self._adv(2)
            if self._peek() == "-":
                self._adv()
            while self._peek() in " \t":
                self._adv()
            st.heredoc = self._word().value.text
            return
        self._adv()
        while self._peek() in "<>&|":
            self._adv()
        st.redirect = True

    def _operator(self, st: "_Building") -> Command | None:
        """At ``;``, ``&``, ``|``, ``(`` or ``)``: end the command (``&>`` is a redirection)."""
        c = self._peek()
        op = c
        if self.s.startswith(("&&", "||", ";;"), self.i):
            op = self.s[self.i : self.i + 2]
        elif c == "&" and self._peek(1) == ">":
            self._adv(2)
            st.redirect = True
            return None
        self._adv(len(op))
        return self._finish(st, op)

    def _skip_blank(self, *, newline: bool) -> bool:
        """Past one blank, line continuation or comment at ``self.i`` (a newline too, with ``newline``: inside an
        array list it separates words, outside it ends a command); False when none starts here."""
        c = self._peek()
        if c in " \t\r" or (newline and c == "\n"):
            self._adv()
        elif c == "\\" and self._peek(1) == "\n":
            self._adv(2)
        elif c == "#":
            end = self.s.find("\n", self.i)
            self._adv((self.n if end < 0 else end) - self.i)
        else:
            return False
        return True

    def _array(self, name: str, append: bool) -> None:
        """After ``NAME=(`` / ``NAME+=(``: the elements up to the closing ``)`` (blanks, newlines, comments and
        line continuations between them), as the array's words."""
        items: list[Word] = []
        while self.i < self.n:
            c = self._peek()
            if self._skip_blank(newline=True):
                continue
            if c == ")":
                self._adv()
                break
            else:
                w = self._word()
                if w.raw == "":
                    self._adv()  # cannot start a word here (an operator inside the list): skip it
                    continue
                items.extend(_spliced(w))
                if len(items) > MAX_ARRAY_WORDS:
                    raise ConfigError(
                        f"line {w.line}: array {name} passes {MAX_ARRAY_WORDS:,} elements: not read",
                        hint="a verl launch passes a few hundred overrides at most; check the array's assignments",
                    )
        self.arrays[name] = (self.arrays.get(name, []) if append else []) + items
        if len(self.arrays[name]) > MAX_ARRAY_WORDS:
            raise ConfigError(f"array {name} passes {MAX_ARRAY_WORDS:,} elements: not read")

    def _add_word(self, st: "_Building", w: Word) -> None:
        if st.redirect:  # a redirection's target, not an argument
            st.redirect = False
            return
        if w.value.elements is not None and _ARRAY_WORD.fullmatch(w.raw):
            st.words.extend(_spliced(w))
            if len(st.words) > MAX_ARRAY_WORDS:
                raise ConfigError(
                    f"line {w.line}: a command passes {MAX_ARRAY_WORDS:,} arguments: not read",
                    hint="a verl launch passes a few hundred overrides at most; check the arrays it expands",
                )
            return
        m = _ASSIGN.match(w.raw) if not st.words else None
        if m:
            val = _tail(w.value, len(m.group(0)))
            st.assigns.append((m.group(1), Word(val, w.line, w.raw, w.start, w.end)))
            st.pending[m.group(1)] = val
        else:
            st.words.append(w)

    def commands(self):
        """Yield each simple command in order; assignments take effect as bash applies them."""
        st = _Building()
        while self.i < self.n:
            c = self._peek()
            if self._skip_blank(newline=False):
                continue
            if c == "\n":
                self._adv()
                cmd = self._finish(st, "\n")
                if cmd:
                    yield cmd
                if st.heredoc is not None:
                    self._skip_heredoc(st.heredoc)
                    st.heredoc = None
            elif c in ";&|()":
                cmd = self._operator(st)
                if cmd:
                    yield cmd
            elif c in "<>":
                self._redirect(st)
            elif not st.words and (arr := _ARRAY_ASSIGN.match(self.s, self.i)):
                self._adv(arr.end() - self.i)
                self._array(arr.group(1), append=arr.group(2) == "+")
            else:
                w = self._word()
                if w.raw == "" and self.i < self.n and self._peek() != "\n":
                    self._adv()  # cannot start a word here: skip the character
                    continue
                self._add_word(st, w)
        cmd = self._finish(st, "")
        if cmd:
            yield cmd

    def _skip_heredoc(self, delim: str) -> None:
        while self.i < self.n:
            end = self.s.find("\n", self.i)
            end = self.n if end < 0 else end
            text = self.s[self.i : end]
            self._adv(min(end + 1, self.n) - self.i)
            if text.strip() == delim:
                return


@dataclass
class _Building:
    """The simple command being read."""

    words: list[Word] = field(default_factory=list)
    assigns: list[tuple[str, Word]] = field(default_factory=list)
    pending: dict[str, Value] = field(default_factory=dict)
    redirect: bool = False
    heredoc: str | None = None


def _spliced(w: Word) -> list[Word]:
    """A word that is only ``"${A[@]}"``: one word per element of A (as bash passes them); any other word as is."""
    if w.value.elements is not None and _ARRAY_WORD.fullmatch(w.raw):
        return list(w.value.elements)
    return [w]


def _tail(v: Value, k: int) -> Value:
    """``v`` without its first ``k`` characters (the ``NAME=`` of an assignment word)."""
    return Value(v.text[k:], list(v.unresolved), list(v.unevaluable), v.literal_dollar, v.caller_args)


_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: _trunc_div(a, b),
    ast.FloorDiv: lambda a, b: _trunc_div(a, b),
    ast.Mod: lambda a, b: a - b * _trunc_div(a, b),
}


def _trunc_div(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _eval_int(node: ast.AST) -> int:
    """Integer arithmetic only (bash's 64-bit integers), no names, no calls."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval_int(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, b = _eval_int(node.left), _eval_int(node.right)
        if isinstance(node.op, ast.Mult) and max(abs(a), abs(b)) > 1 << 62:
            raise ValueError("too large")
        return _OPS[type(node.op)](a, b)
    raise ValueError("not integer arithmetic")
