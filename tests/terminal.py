"""What a person would see: a command run under a pseudo-terminal, its output drawn on a small screen.

``Screen`` understands what progress bars and ``ringtrain run``'s console use: printable text with
wrapping, carriage return, line feed, backspace, erase-to-end-of-line and cursor-up; colours and
other escape sequences are skipped.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import struct
import subprocess
import termios
import time
from collections.abc import Callable, Mapping, Sequence

_ESCAPE = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")


class Screen:
    """A terminal of ``columns`` columns and unlimited height (its scroll-back is kept)."""

    def __init__(self, columns: int = 100) -> None:
        self.columns = columns
        self.rows: list[list[str]] = [[]]
        self.row = self.col = 0

    def feed(self, text: str) -> None:
        """Draw ``text`` as a terminal would."""
        i = 0
        while i < len(text):
            escape = _ESCAPE.match(text, i)
            if escape:
                self._escape(escape.group(1), escape.group(2))
                i = escape.end()
                continue
            ch = text[i]
            i += 1
            if ch == "\r":
                self.col = 0
            elif ch == "\n":
                self._down()
            elif ch == "\b":
                self.col = max(self.col - 1, 0)
            elif ch >= " ":
                if self.col >= self.columns:
                    self._down()
                    self.col = 0
                line = self.rows[self.row]
                line.extend(" " * (self.col + 1 - len(line)))
                line[self.col] = ch
                self.col += 1

    def _down(self) -> None:
        self.row += 1
        while len(self.rows) <= self.row:
            self.rows.append([])

    def _escape(self, params: str, command: str) -> None:
        if command == "K":  # erase from the cursor to the end of the line (the only mode we use)
            del self.rows[self.row][self.col:]
        elif command == "A":
            self.row = max(self.row - int(params or 1), 0)

    def lines(self) -> list[str]:
        """Every row as text, trailing blanks and empty rows at the end removed."""
        out = ["".join(r).rstrip() for r in self.rows]
        while out and not out[-1]:
            out.pop()
        return out

    def cursor_line(self) -> str:
        """The row the cursor is on (where a live line is drawn)."""
        return "".join(self.rows[self.row]).rstrip()


class PtyRun:
    """A command whose stdout and stderr are one pseudo-terminal, drawn on a ``Screen``."""

    def __init__(self, argv: Sequence[str], columns: int = 100, env: Mapping[str, str] | None = None,
                 cwd: str | None = None) -> None:
        self.screen = Screen(columns)
        self.raw = ""
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
        environ = dict(os.environ if env is None else env)
        for name in ("COLUMNS", "LINES", "TQDM_NCOLS"):
            environ.pop(name, None)
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                                     env=environ, cwd=cwd, start_new_session=True)
        os.close(slave)
        self.master = master
        self._closed = False

    def _read(self, timeout: float) -> bool:
        """Draw what arrived within ``timeout`` s; False once the terminal is closed (the command ended)."""
        if self._closed:
            return False
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.master, 1 << 16)
        except OSError:  # EIO: every writer closed the terminal
            data = b""
        if not data:
            self._closed = True
            os.close(self.master)
            return False
        text = data.decode(errors="replace")
        self.raw += text
        self.screen.feed(text)
        return True

    def wait_for(self, condition: Callable[[Screen], bool], timeout: float = 120.0) -> bool:
        """Draw output until ``condition(screen)`` holds (True) or the command ended or time ran out."""
        deadline = time.monotonic() + timeout
        while not condition(self.screen):
            if time.monotonic() > deadline or not self._read(0.1):
                return condition(self.screen)
        return True

    def finish(self, timeout: float = 300.0) -> int:
        """Draw everything until the command ends; returns its exit code."""
        deadline = time.monotonic() + timeout
        while self._read(0.1) and time.monotonic() < deadline:
            pass
        try:
            return self.proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
        finally:
            if not self._closed:
                with contextlib.suppress(OSError):
                    os.close(self.master)
                self._closed = True
