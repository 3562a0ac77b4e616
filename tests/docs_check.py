"""Checkers that keep the user documentation true to the code (used by tests/test_docs.py).

Each checker takes the repository root (and, where it matters, the files to read) and returns a list of
:class:`Problem` (``file:line: what is wrong``); an empty list means the documentation passes. Nothing
here starts a process or touches the network: the commands named in the docs are checked against the
real argparse tree of ``ringtrain`` (:func:`ringtrain.cli.main.build_parser`), walked through its
``_SubParsersAction`` choices.

The checkers:

- :func:`command_problems`: every ``ringtrain SUBCOMMAND ...`` (and ``horovodrun ...``, the alias of
  ``ringtrain run``) in a fenced shell block or an inline code span names a subcommand, choices and
  flags that exist.
- :func:`link_problems`: every relative markdown link reaches a file, and its ``#anchor`` a heading.
- :func:`index_problems`: ``docs/index.md`` lists every page of ``docs/`` once, honestly.
- :func:`conformance_problems`: the ``horovodrun`` flag table of ``docs/horovod-conformance.md`` agrees
  with what ``ringtrain run`` accepts.
- :func:`diary_problems`: no development-diary text (commit hashes, "load average 7-10", ...).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

#: The pages whose commands, flags and diary text are checked.
USER_DOCS: tuple[str, ...] = ("docs/*.md", "README.md")
#: The pages whose links are checked.
LINKED_DOCS: tuple[str, ...] = ("docs/*.md", "README.md", "CONTRIBUTING.md", "benchmarks/README.md",
                                "examples/README.md")
#: Launcher names that run ``ringtrain <subcommand>`` with the same flags (``ringtrain install-aliases``).
ALIASES: dict[str, str] = {"horovodrun": "run"}
#: Fenced blocks whose lines are shell command lines (an unnamed fence is read as shell too).
SHELL_FENCES = frozenset({"", "bash", "sh", "shell", "console", "zsh", "text"})
#: A command preceded by one of these words is a package or a path, not a command line
#: (``pip install ringtrain``, ``git clone .../ringtrain``, ``cd ringtrain``).
NOT_A_COMMAND_AFTER = frozenset({"install", "uninstall", "show", "clone", "cd", "import", "from", "which",
                                 "ls", "mkdir", "rm"})


@dataclass(frozen=True, order=True)
class Problem:
    """One thing wrong in the documentation, at ``path:line`` (path relative to the root)."""

    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def doc_files(root: Path, patterns: Iterable[str] = USER_DOCS) -> list[Path]:
    """The existing files matching ``patterns`` (globs relative to ``root``), sorted, each once."""
    found: set[Path] = set()
    for pattern in patterns:
        found.update(p for p in root.glob(pattern) if p.is_file())
    return sorted(found)


def _relative(root: Path, path: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


# --------------------------------------------------------------------------------------------------
# Markdown: fenced blocks, inline code spans, prose
# --------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
_INLINE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)


@dataclass(frozen=True)
class Fence:
    """A fenced code block: its language and its lines, each with its line number (1-based)."""

    lang: str
    lines: tuple[tuple[int, str], ...]


def split_markdown(text: str) -> tuple[list[Fence], str]:
    """The fenced blocks of ``text``, and the text outside them (fences blanked, so offsets and line
    numbers of the rest stay those of ``text``)."""
    fences: list[Fence] = []
    outside: list[str] = []
    current: list[tuple[int, str]] | None = None
    marker, lang = "", ""
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        match = _FENCE.match(line)
        if current is None:
            if match:
                marker, lang, current = match.group(2), match.group(3).lower(), []
                outside.append("\n")
            else:
                outside.append(line)
            continue
        if match and match.group(2)[0] == marker[0] and len(match.group(2)) >= len(marker) \
                and not match.group(3):
            fences.append(Fence(lang, tuple(current)))
            current = None
        else:
            current.append((number, line.rstrip("\n")))
        outside.append("\n")
    if current is not None:
        fences.append(Fence(lang, tuple(current)))
    return fences, "".join(outside)


def line_of(text: str, offset: int) -> int:
    """The 1-based line number of ``offset`` in ``text``."""
    return text.count("\n", 0, offset) + 1


def inline_spans(prose: str) -> Iterator[tuple[int, str]]:
    """``(line, content)`` of every inline code span of ``prose`` (text outside the fences); a span
    may wrap onto the next line, never across a blank line; table escapes (``\\|``) are undone."""
    for match in _INLINE.finditer(prose):
        content = match.group(2)
        if "\n\n" in content or re.search(r"\n\s*\n", content):
            continue
        yield line_of(prose, match.start()), content.replace("\\|", "|").replace("\n", " ").strip()


def without_code(prose: str) -> str:
    """``prose`` with every inline code span blanked (same length, newlines kept)."""
    return _INLINE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), prose)


# --------------------------------------------------------------------------------------------------
# 1. Commands and flags
# --------------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    """The real ``ringtrain`` parser (imported here: a checker that needs no parser does not pay)."""
    from ringtrain.cli.main import build_parser as build

    return build()


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands of ``parser`` (its ``_SubParsersAction`` choices), empty if it has none."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def subparser(parser: argparse.ArgumentParser, *names: str) -> argparse.ArgumentParser:
    """The parser of ``ringtrain NAMES...`` (e.g. ``subparser(p, "script", "slurm")``)."""
    for name in names:
        parser = subcommands(parser)[name]
    return parser


def accepts(parser: argparse.ArgumentParser, word: str) -> bool:
    """True when ``parser`` takes the option ``word`` (``--flag``, ``--flag=VALUE``, ``-xVALUE``), as
    argparse with ``allow_abbrev=False`` (every ringtrain parser) matches it: exactly."""
    return _action_of(parser, word) is not None


#: The dest prefix of an option that a parser takes only to refuse it with a hint (``ringtrain script pbs
#: --partition``: "PBS has queues, use --queue"): documenting one is documenting an error.
REFUSING_DEST_PREFIX = "foreign_"


def _action_of(parser: argparse.ArgumentParser, word: str) -> tuple[argparse.Action, bool] | None:
    """The action ``word`` sets and whether the word carries its value already; None for a flag the
    parser does not have or has only to refuse (:data:`REFUSING_DEST_PREFIX`)."""
    found = _parsed_action(parser, word)
    if found is not None and found[0].dest.startswith(REFUSING_DEST_PREFIX):
        return None
    return found


def _parsed_action(parser: argparse.ArgumentParser, word: str) -> tuple[argparse.Action, bool] | None:
    options = parser._option_string_actions
    if word in options:
        return options[word], False
    name, sep, _ = word.partition("=")
    if sep and name in options:
        return options[name], True
    # argparse's attached value of a one-letter option: -xNCCL_DEBUG=INFO, -p2222; a value its type
    # refuses is refused (-prefix-timestamp is -p with the port "refix-timestamp": an error)
    if not word.startswith("--") and len(word) > 2 and word[:2] in options:
        action = options[word[:2]]
        if action.nargs == 0:
            return None
        if callable(action.type):
            try:
                action.type(word[2:])
            except (argparse.ArgumentTypeError, TypeError, ValueError):
                return None
        return action, True
    return None


def is_placeholder(word: str) -> bool:
    """A word that stands for something: ``N``, ``WORKLOAD``, ``<host>``, ``[OPTIONS]``, ``$ARGS``..."""
    stripped = word.strip("[]{}<>()")
    return (word.startswith(("<", "[", "{", "$")) or word in ("...", "…")
            or (bool(stripped) and stripped.upper() == stripped and any(c.isalpha() for c in stripped)
                and "=" not in stripped))


def _split_options(word: str) -> list[str]:
    """``--min-np/--max-np`` (a doc's shorthand for two flags) as its flags; other words as they are."""
    if word.startswith("-") and "/-" in word:
        return [part for part in word.split("/") if part]
    return [word]


#: What a subcommand looks like: ``ringtrain run: error: ...`` (output) and ``ringtrain 0.1.0`` are no
#: commands.
_COMMAND_WORD = re.compile(r"[a-z][a-z0-9-]*")


def check_command(parser: argparse.ArgumentParser, words: Sequence[str], prog: str) -> list[str]:
    """What is wrong in the command line ``prog WORDS...`` as ``parser`` reads it (empty: nothing).

    Checking ends where the user's program begins: at ``--``, at ``...``, at the first word taken by a
    ``REMAINDER`` positional (``ringtrain run -np 2 python train.py --epochs 1``: ``--epochs`` is the
    script's), or after an unknown flag (its value cannot be told from a positional).
    """
    problems: list[str] = []
    children = subcommands(parser)
    positionals = [a for a in parser._actions if not a.option_strings
                   and not isinstance(a, argparse._SubParsersAction)]
    position = 0
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word in ("--", "...", "…"):
            break
        if word.startswith("-") and len(word) > 1 and not re.fullmatch(r"-[\d.]+", word):
            for flag in _split_options(word):
                found = _action_of(parser, flag)
                if found is None:
                    name = flag.partition("=")[0]
                    problems.append(f"`{prog}` has no option {name}")
                    return problems
            action, attached = found
            i = _skip_values(action, attached, words, i)
            continue
        # a positional word
        if children:
            if word in children:
                return problems + check_command(children[word], words[i:], f"{prog} {word}")
            if not _COMMAND_WORD.fullmatch(word):
                return problems  # output quoted in the docs ("ringtrain run: error: ..."), not a command
            if not is_placeholder(word):
                problems.append(f"`{prog}` has no subcommand {word!r} (it has: {', '.join(children)})")
            return problems
        if position >= len(positionals):
            if not is_placeholder(word):
                problems.append(f"`{prog}` takes no argument {word!r} here")
            return problems
        action = positionals[position]
        if action.nargs == argparse.REMAINDER:
            return problems  # the user's program starts here
        if action.choices is not None and word not in action.choices and not is_placeholder(word):
            choices = ", ".join(map(str, action.choices))
            problems.append(f"`{prog}`: {word!r} is not a {action.metavar or action.dest} (one of {choices})")
        if action.nargs not in ("*", "+"):
            position += 1
    return problems


def _skip_values(action: argparse.Action, attached: bool, words: Sequence[str], i: int) -> int:
    """The index after the values ``action`` takes from ``words[i:]`` (argparse's rule, roughly)."""
    if attached or action.nargs == 0:
        return i
    def is_value(w: str) -> bool:
        return w not in ("--", "...") and (not w.startswith("-") or bool(re.fullmatch(r"-[\d.]+", w)))
    if action.nargs is None:
        return i + 1 if i < len(words) else i
    if isinstance(action.nargs, int):
        return min(len(words), i + action.nargs)
    if action.nargs == "?":
        return i + 1 if i < len(words) and is_value(words[i]) else i
    while i < len(words) and is_value(words[i]):  # "*", "+"
        i += 1
    return i


_SEPARATORS = frozenset({"|", "||", "&&", ";", "&", "(", ")", "`", "$("})


def shell_words(line: str) -> list[str]:
    """``line`` split as a shell would (comments dropped, ``|``, ``&&``, ``;`` as words of their own);
    a line shlex cannot split (an open quote) is split on spaces."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:
        return line.split()


def commands_in(words: Sequence[str]) -> Iterator[tuple[str, list[str]]]:
    """``(subcommand path prefix, words after it)`` of every ringtrain command in a shell line:
    ``ringtrain ...`` (also ``.venv/bin/ringtrain``, ``python -m ringtrain``) and its aliases, wherever
    the line runs it (``srun -N 2 ringtrain run ...``), but not a package name (``pip install ringtrain``)."""
    for index, word in enumerate(words):
        previous = words[index - 1] if index else ""
        if previous in NOT_A_COMMAND_AFTER:
            continue
        name = word.rsplit("/", 1)[-1]
        if name not in ("ringtrain", *ALIASES):
            continue
        if index and previous.startswith("-") and previous != "-m":
            continue  # the value of someone's option (--name ringtrain)
        rest = list(words[index + 1:])
        for stop, sep in enumerate(rest):
            if sep in _SEPARATORS or sep.startswith((">", "2>", "<")):
                rest = rest[:stop]
                break
        yield (ALIASES.get(name, ""), rest)


def command_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, command text)`` of every shell line in a fenced block and every inline code span of
    ``path``; continued lines (``\\`` at the end) are joined, and a fenced line laid out in columns
    (commands apart by 3 spaces or more) is one command per column."""
    text = path.read_text(encoding="utf-8")
    fences, prose = split_markdown(text)
    for fence in fences:
        if fence.lang not in SHELL_FENCES:
            continue
        pending: list[str] = []
        start = 0
        for number, line in fence.lines:
            if not pending:
                start = number
            stripped = line.strip()
            if stripped.startswith("$ "):
                stripped = stripped[2:]
            if stripped.endswith("\\"):
                pending.append(stripped[:-1])
                continue
            pending.append(stripped)
            for column in re.split(r"\s{3,}", " ".join(pending)):
                yield start, column
            pending = []
        if pending:
            yield start, " ".join(pending)
    yield from inline_spans(prose)


def name_of(alias: str) -> str:
    """The launcher name that runs ``ringtrain ALIAS`` (``run`` -> ``horovodrun``)."""
    return next(name for name, subcommand in ALIASES.items() if subcommand == alias)


def command_problems(root: Path, files: Iterable[Path] | None = None,
                     parser: argparse.ArgumentParser | None = None) -> list[Problem]:
    """Every ``ringtrain ...`` / ``horovodrun ...`` command in ``files`` (default: the user docs) that
    names a subcommand, a choice or a flag the real parser does not have."""
    parser = build_parser() if parser is None else parser
    problems = []
    for path in doc_files(root) if files is None else files:
        for number, text in command_lines(path):
            for alias, words in commands_in(shell_words(text)):
                if alias:
                    target, prog = subparser(parser, alias), f"{name_of(alias)} (ringtrain {alias})"
                else:
                    target, prog = parser, "ringtrain"
                for message in check_command(target, words, prog):
                    problems.append(Problem(_relative(root, path), number, f"{message}: {text.strip()}"))
    return sorted(set(problems))


# --------------------------------------------------------------------------------------------------
# 2. Links and anchors
# --------------------------------------------------------------------------------------------------

_LINK = re.compile(r"!?\[(?P<text>(?:[^\[\]]|\[[^\]]*\])*)\]"
                   r"\((?P<target><[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+(\S+)", re.MULTILINE)
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=[\"']([^\"']+)[\"']", re.IGNORECASE)
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text: its rendered text lowercased, every character that is not
    a letter, digit, space, ``-`` or ``_`` dropped, each space turned into ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = text.lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def headings(text: str) -> list[tuple[int, int, str]]:
    """``(line, level, text)`` of every ATX heading outside the fenced blocks."""
    _, prose = split_markdown(text)
    found = []
    for number, line in enumerate(prose.splitlines(), start=1):
        match = _HEADING.match(line)
        if match:
            found.append((number, len(match.group(1)), match.group(2)))
    return found


def anchors(text: str) -> set[str]:
    """Every anchor a page offers: its headings' slugs (a repeated slug gets -1, -2, ... as on GitHub)
    and explicit ``<a name=...>`` / ``<a id=...>``."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, _, heading in headings(text):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    found.update(_HTML_ANCHOR.findall(text))
    return found


def links(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, target)`` of every markdown link and reference definition of ``path``, outside code."""
    _, prose = split_markdown(path.read_text(encoding="utf-8"))
    prose = without_code(prose)
    for match in _LINK.finditer(prose):
        yield line_of(prose, match.start()), match.group("target").strip("<>")
    for match in _REFERENCE.finditer(prose):
        yield line_of(prose, match.start()), match.group(1).strip("<>")


def link_problems(root: Path, files: Iterable[Path] | None = None) -> list[Problem]:
    """Every relative link of ``files`` (default: :data:`LINKED_DOCS`) whose file does not exist, or
    whose ``#anchor`` is no heading of its target; ``http(s)://`` and other schemes are not fetched."""
    problems = []
    cache: dict[Path, set[str]] = {}
    for path in doc_files(root, LINKED_DOCS) if files is None else files:
        where = _relative(root, path)
        for number, target in links(path):
            if _EXTERNAL.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            destination = (path.parent / file_part).resolve() if file_part else path.resolve()
            if not destination.exists():
                problems.append(Problem(where, number, f"link to a missing file: {target}"))
                continue
            if not anchor:
                continue
            if destination.is_dir() or destination.suffix.lower() != ".md":
                problems.append(Problem(where, number, f"anchor on a file that is no page: {target}"))
                continue
            if destination not in cache:
                cache[destination] = anchors(destination.read_text(encoding="utf-8"))
            if anchor.lower() not in cache[destination]:
                problems.append(Problem(where, number, f"link to a missing heading: {target} "
                                                       f"(no heading of {destination.name} has that slug)"))
    return sorted(problems)


# --------------------------------------------------------------------------------------------------
# 3. docs/index.md
# --------------------------------------------------------------------------------------------------

#: Status phrases an index row may use about a page; the page must say the same of itself.
STATUS_PHRASES: tuple[str, ...] = ("nothing yet", "not yet verified", "not yet", "not verified", "untested",
                                   "not tested", "verified on", "experimental")
_ROW_LINK = re.compile(r"^\|\s*\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)\s*\|(?P<rest>.*)$")
_ROW_TITLE = re.compile(r"^\*\*(?P<title>.+?)\*\*(?!\*)")


def title(text: str) -> str | None:
    """A page's title: its first level-1 heading, white space normalised; None if it has none."""
    for _, level, heading in headings(text):
        if level == 1:
            return " ".join(heading.split())
    return None


def index_problems(root: Path) -> list[Problem]:
    """What is wrong with ``docs/index.md``, the list of the pages.

    The rule (kept simple so that it cannot be argued with):

    - every ``docs/*.md`` page but ``index.md`` has exactly one row, a table row that starts with a link
      to it; every row's link reaches an existing file;
    - a row's link text is its link target as written (``[launching.md](launching.md)``), so the
      reader sees which file the row is about;
    - a row's description (the rest of the row) is not empty;
    - title: the description of a ``docs/`` page's row starts with the page's title (its first ``# ``
      heading) in bold, word for word (``**Restarts and the rendezvous**: ...``); a row of a page
      elsewhere (``../benchmarks/README.md``) may, and then the same holds;
    - status: when a row's description uses one of :data:`STATUS_PHRASES` (``nothing yet``,
      ``not yet``, ``untested``, ``verified on``...), the page itself contains that phrase
      (case-insensitive, spaces and line breaks alike): the index may not claim a state the page does
      not admit, nor keep a claim the page dropped.
    """
    index = root / "docs" / "index.md"
    where = _relative(root, index)
    if not index.exists():
        return [Problem(where, 0, "docs/index.md is missing")]
    counts: dict[Path, list[int]] = {}
    problems = []
    docs = (root / "docs").resolve()
    _, prose = split_markdown(index.read_text(encoding="utf-8"))
    for number, line in enumerate(prose.splitlines(), start=1):
        match = _ROW_LINK.match(line.strip())
        if not match:
            continue
        target, text = match.group("target"), match.group("text")
        destination = (index.parent / target.partition("#")[0]).resolve()
        counts.setdefault(destination, []).append(number)
        if not destination.is_file():
            problems.append(Problem(where, number, f"row links to a missing file: {target}"))
            continue
        if text.strip("` ") != target:
            problems.append(Problem(where, number,
                                    f"row's link text {text!r} is not its file name {target!r}"))
        description = match.group("rest").strip().removesuffix("|").strip()
        if not description:
            problems.append(Problem(where, number, f"row of {target} has no description"))
        page_text = destination.read_text(encoding="utf-8")
        page_title = title(page_text)
        shown = _ROW_TITLE.match(description)
        if (shown or destination.parent == docs) and page_title is None:
            problems.append(Problem(where, number, f"{target} has no title (a first `# ` heading)"))
        elif shown or destination.parent == docs:
            if shown is None:
                problems.append(Problem(where, number, f"row of {target} does not start with the page's "
                                                       f"title in bold: **{page_title}**"))
            elif " ".join(shown.group("title").split()) != page_title:
                problems.append(Problem(where, number, f"row of {target} gives the title "
                                                       f"{shown.group('title')!r}, the page's is "
                                                       f"{page_title!r}"))
        page = _normal(page_text)
        for phrase in STATUS_PHRASES:
            if re.search(rf"\b{re.escape(phrase)}\b", _normal(description)) and phrase not in page:
                problems.append(Problem(where, number, f"row says {phrase!r} of {target}, the page does not"))
    for page in sorted((root / "docs").glob("*.md")):
        if page.name == "index.md":
            continue
        rows = counts.get(page.resolve(), [])
        if not rows:
            problems.append(Problem(where, 0, f"docs/{page.name} has no row in the index"))
        elif len(rows) > 1:
            lines = ", ".join(map(str, rows))
            problems.append(Problem(where, rows[1], f"docs/{page.name} has {len(rows)} rows (lines {lines})"))
    return sorted(problems)


def _normal(text: str) -> str:
    """``text`` lowercased with every run of white space as one space (a phrase may wrap)."""
    return re.sub(r"\s+", " ", text.lower())


# --------------------------------------------------------------------------------------------------
# 4. The horovodrun flag table of docs/horovod-conformance.md
# --------------------------------------------------------------------------------------------------

CONFORMANCE_PAGE = "docs/horovod-conformance.md"
#: Fewer parsed flag rows than this means the table's format changed under the parser: a failure,
#: not a silent pass.
MIN_FLAG_ROWS = 10
_FLAG_SPAN = re.compile(r"`(-{1,2}[A-Za-z][\w-]*)`")
#: ``--flag``: not supported, ``-a``, ``--b``: not supported (inside a Notes cell): refused flags.
_REFUSED_IN_NOTES = re.compile(r"((?:`-{1,2}[A-Za-z][\w-]*`(?:,\s*|\s+and\s+|\s+or\s+)?)+):?\s+not supported",
                               re.IGNORECASE)


#: Notes that promise a warning: ``Accepted with a warning``, ``accepted with one warning``, ``accepted and
#: ignored``.
_WARNS = re.compile(r"\baccepted\s+(?:with\s+(?:a|one)\s+warning|and\s+ignored)", re.IGNORECASE)


@dataclass(frozen=True)
class FlagRow:
    """A row of the flag table: its flags, what it claims, at which line."""

    line: int
    flags: tuple[str, ...]
    status: str  # "supported", "accepted" (accepted and ignored, with a warning) or "refused"
    refused_in_notes: tuple[str, ...]
    warns: bool = False  # the notes say it is accepted with a warning


def classify(status: str, notes: str) -> str | None:
    """What a row claims: ``supported`` (same / differs / supported / yes / ✓), ``accepted`` (not
    supported, but the notes say it is accepted: ignored with a warning), ``refused`` (not supported /
    refused / no / ✗, or the notes say the flag is not under ``run``); None for a status not understood."""
    status = status.strip().strip("*_ ").lower()
    notes = notes.lower()
    if "not under `run`" in notes:
        return "refused"
    if status in ("not supported", "unsupported", "refused", "no", "✗", "❌"):
        return "accepted" if re.search(r"\baccepted\b", notes) else "refused"
    if status in ("same", "differs", "supported", "yes", "✓", "✅", "partial"):
        return "supported"
    if status == "ignored":
        return "accepted"
    return None


def flag_rows(text: str) -> tuple[list[FlagRow], list[tuple[int, str]]]:
    """The rows of the ``horovodrun`` flag table(s) in ``text`` (sections whose heading names
    ``horovodrun`` and flags), and the rows that name flags but whose status could not be read."""
    rows: list[FlagRow] = []
    unreadable: list[tuple[int, str]] = []
    in_section = False
    _, prose = split_markdown(text)
    for number, line in enumerate(prose.splitlines(), start=1):
        heading = _HEADING.match(line)
        if heading:
            in_section = "horovodrun" in heading.group(2) and "flag" in heading.group(2).lower()
            continue
        if not in_section or not line.lstrip().startswith("|"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) < 2:
            continue
        flags = tuple(_FLAG_SPAN.findall(cells[0]))
        if not flags:
            continue
        notes = " ".join(cells[2:])
        status = classify(cells[1], notes)
        if status is None:
            unreadable.append((number, cells[1]))
            continue
        refused = tuple(f for group in _REFUSED_IN_NOTES.findall(notes) for f in _FLAG_SPAN.findall(group))
        rows.append(FlagRow(number, flags, status, refused, bool(_WARNS.search(notes))))
    return rows, unreadable


def launcher_notes_name(run: argparse.ArgumentParser, flag: str) -> bool:
    """True when ``ringtrain run -np 1 FLAG [VALUE] python x.py``, parsed by ``run`` and turned into a
    launch configuration by the real :func:`ringtrain.cli.run.config_from_args` (nothing is started),
    carries a note (the launcher's warning) that names the flag (``--no-x``: ``--x`` will do)."""
    from ringtrain.cli.run import config_from_args
    from ringtrain.exceptions import UsageError

    found = _action_of(run, flag)
    if found is None:
        return False
    action, attached = found
    count = 0 if attached or action.nargs == 0 or action.nargs == "?" else \
        action.nargs if isinstance(action.nargs, int) else 1
    names = {flag.partition("=")[0], flag.partition("=")[0].replace("--no-", "--", 1)}
    candidates = [str(next(iter(action.choices)))] if action.choices else ["1", "x"]
    for value in candidates:
        argv = ["-np", "1", flag, *[value] * count, "python", "x.py"]
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                args = run.parse_args(argv)
            notes = config_from_args(args).notes
        except (SystemExit, UsageError):
            continue
        return any(name in note for note in notes for name in names)
    return False


def conformance_problems(root: Path, parser: argparse.ArgumentParser | None = None,
                         min_rows: int = MIN_FLAG_ROWS) -> list[Problem]:
    """Where the ``horovodrun`` flag table of :data:`CONFORMANCE_PAGE` and ``ringtrain run`` disagree.

    - a flag in a row marked supported (same / differs) must be accepted by ``ringtrain run``;
    - one in a row marked not supported whose notes say it is accepted (with a warning) must be
      accepted too: it is;
    - one in a row whose notes say it is accepted with a warning (or accepted and ignored) must make
      the launcher say so: a note of the real ``config_from_args`` names it;
    - one in a row marked not supported otherwise, one named in the notes as ``--flag``: not supported,
      and one the notes say is not under ``run`` must be refused: a parser that takes it silently
      contradicts the table;
    - a row that names flags but whose status is none of these words is a problem, and so are fewer than
      ``min_rows`` rows (a reformatted table must not turn the check into a silent pass).
    """
    page = root / CONFORMANCE_PAGE
    where = _relative(root, page)
    if not page.exists():
        return [Problem(where, 0, f"{CONFORMANCE_PAGE} is missing")]
    run = subparser(build_parser() if parser is None else parser, "run")
    rows, unreadable = flag_rows(page.read_text(encoding="utf-8"))
    problems = [Problem(where, number, f"flag row with a status not understood: {status!r}")
                for number, status in unreadable]
    if len(rows) < min_rows:
        problems.append(Problem(where, 0, f"only {len(rows)} horovodrun flag rows parsed (at least "
                                          f"{min_rows} expected): did the table's format change?"))
    for row in rows:
        for flag in row.flags:
            taken = accepts(run, flag)
            if row.status in ("supported", "accepted") and not taken:
                problems.append(Problem(where, row.line, f"{flag} is marked {row.status} but `ringtrain run` "
                                                         "does not accept it"))
            elif row.status == "refused" and taken:
                problems.append(Problem(where, row.line, f"{flag} is marked not supported but `ringtrain "
                                                         "run` accepts it (say what it does, or refuse it)"))
            if row.warns and taken and not launcher_notes_name(run, flag):
                problems.append(Problem(where, row.line, f"{flag} is said to be accepted with a warning, but "
                                                         "`ringtrain run` says nothing about it"))
        for flag in row.refused_in_notes:
            if accepts(run, flag):
                problems.append(Problem(where, row.line, f"{flag} is said to be not supported but "
                                                         "`ringtrain run` accepts it"))
    return sorted(problems)


# --------------------------------------------------------------------------------------------------
# 5. Diary markers
# --------------------------------------------------------------------------------------------------

#: Text that belongs in a commit message or an issue, not in user docs: what the project went through,
#: on which machine. Each is matched case-insensitively across line breaks (``\s+`` between words).
DIARY_MARKERS: tuple[tuple[str, str], ...] = (
    # history of the code ("restarts used to fail"); the passive "is used to decide" is plain English
    (r"(?<!\bis )(?<!\bare )(?<!\bbe )(?<!\bbeen )(?<!\bnot )(?<!\bwas )(?<!\bwere )\bused\s+to\b",
     "'used to' (how it was before)"),
    # the load of the machine a number was measured on; "load average" as a field's name is fine
    (r"\bload\s+average\s+(?:of\s+|about\s+|~\s*)?\d", "load average of a measurement"),
    # the tracker's issue, named as if the reader had it open
    (r"\bthe\s+issue'?s\b", "'the issue's' (refers to a tracker issue)"),
    (r"\b(?:before|since|after|until)\s+issue\s+\d+\b", "'before issue N' (history of the tracker)"),
    # steps of a work session
    (r"\bthis\s+stop\b", "'this stop' (a work session's step)"),
    # ("stop 12"; "the ranks stop 10 s later" is a duration, not a step)
    (r"\bstop\s+\d+\b(?!\s*(?:s|ms|seconds?|minutes?|min|h|hours?)\b)", "'stop N' (a work session's step)"),
    (r"\bwe\s+did\s+not\s+isolate\b", "'we did not isolate' (an open investigation)"),
    # the developers' own machines
    (r"\bdevelopment\s+(?:machine|VM)\b", "the development machine"),
    (r"\b(?:Intel\s+Xeon|AMD\s+EPYC)\s+VM\b", "a developer's VM"),
)
#: A commit hash: 7-40 lowercase hex digits with at least one digit and one letter, a word of its own
#: (not part of a URL, a path or a file name).
_HEX = re.compile(r"(?<![\w/.:#-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w/.-])")
#: Hex words that are not commits: a checksum (``md5 c58f...``), an id in a quoted message
#: (``node id a9a963b91145``).
_HEX_LABEL = re.compile(r"\b(?:md5|sha\d*|checksum|digest|id)\b[^\n]{0,8}$", re.IGNORECASE)


def diary_problems(root: Path, files: Iterable[Path] | None = None) -> list[Problem]:
    """Every diary marker (:data:`DIARY_MARKERS`, commit hashes) in ``files`` (default: the user
    docs), fenced blocks included, as ``file:line`` and the marker."""
    problems = []
    compiled = [(re.compile(pattern, re.IGNORECASE), why) for pattern, why in DIARY_MARKERS]
    for path in doc_files(root) if files is None else files:
        text = path.read_text(encoding="utf-8")
        where = _relative(root, path)
        for pattern, why in compiled:
            for match in pattern.finditer(text):
                problems.append(Problem(where, line_of(text, match.start()),
                                        f"diary marker {why}: {' '.join(match.group(0).split())!r}"))
        for match in _HEX.finditer(text):
            before = text[max(0, match.start() - 20):match.start()]
            if _HEX_LABEL.search(before):
                continue
            problems.append(Problem(where, line_of(text, match.start()),
                                    f"diary marker commit hash: {match.group(0)!r}"))
    return sorted(problems)
