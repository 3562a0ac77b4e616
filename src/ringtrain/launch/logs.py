"""Where worker output goes: per-rank files, and this console with a ``[rank]`` prefix.

The elastic agent redirects each worker's stdout/stderr into files: horovodrun's
``DIR/rank.<padded>/stdout|stderr`` with ``--output-filename DIR``, otherwise a private temporary
folder that the launcher removes afterwards. :class:`ConsoleRelay` copies those files to this
process's console. It replaces torch's own tailer, which reads the files line by line in text mode:
that turns every carriage return of a progress bar into a line of its own, and prints the half line
it finds at the end of a file as if it were whole, so that the next prefix lands mid-line.

The relay prints whole lines only, each in one write, so ranks never interleave inside a line. A
carriage return redraws the line it ends, as on a terminal. Rank 0's redrawn line (a tqdm bar, the
Trainer's progress) is drawn as one live line at the bottom of a terminal, cleared and drawn again
around the other ranks' lines; in a file or a pipe, and for the other ranks, a redrawn line is
printed as an ordinary line: its first state, then at most one every :data:`UPDATE_LINE_INTERVAL_S`
seconds, and its last state. ``--redirects`` / ``--tee`` keep chosen streams off the console (files
only).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from typing import BinaryIO, TextIO

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
from torch.distributed.elastic.multiprocessing.api import LogsDest, to_map

#: Set to ``1`` for the workers when this console is a terminal where rank 0's carriage-return updates
#: are drawn as one live line: the Trainer then shows a progress bar rather than a line now and then.
LIVE_CONSOLE_VARIABLE = "RINGTRAIN_LIVE_CONSOLE"

#: Seconds between two lines printed for a redrawn line (a progress bar) where it cannot be redrawn.
UPDATE_LINE_INTERVAL_S = 10.0

#: Seconds between two looks at the ranks' files.
POLL_INTERVAL_S = 0.05

#: The rank whose redrawn line is drawn live on a terminal.
LIVE_RANK = 0

_ERASE_TO_END = "\x1b[K"
_LINE_ENDS = re.compile(rb"[\r\n]")
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def padded_rank(rank: int, size: int) -> str:
    """Rank with as many digits as the largest rank, as horovodrun names its output folders."""
    return str(rank).zfill(len(str(max(size - 1, 0))))


def line_prefix(rank: int) -> str:
    """What starts every line a rank prints on the console."""
    return f"[{rank}] "


class RedrawnLine:
    """The bytes of one stream cut into whole lines, with the states of a line redrawn by ``\\r``.

    As on a terminal, text after a carriage return overwrites the line from its start. ``feed``
    returns, in order, each completed line as it finally reads (``("line", text)``) and each state a
    carriage return completed (``("update", text)``; empty when a bar was cleared).
    """

    def __init__(self) -> None:
        self._screen = ""
        self._tail = b""
        self._redrawn = False

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        """Take more bytes; returns the lines and redrawn states they completed, in order."""
        self._tail += data
        events = []
        while (found := _LINE_ENDS.search(self._tail)) is not None:
            end = found.start()
            segment = self._tail[:end].decode(errors="replace")
            self._tail = self._tail[end + 1:]
            self._screen = segment + self._screen[len(segment):]
            if found.group() == b"\n":
                text = self._screen.rstrip()
                if text or not self._redrawn:  # a bar cleared with blanks leaves no line behind
                    events.append(("line", text))
                self._screen, self._redrawn = "", False
            else:
                self._redrawn = True
                events.append(("update", self._screen.rstrip()))
        return events

    def current(self) -> str:
        """The unfinished line as a terminal would show it now."""
        shown = self._tail.decode(errors="ignore")
        return (shown + self._screen[len(shown):]).rstrip()


class _Source:
    """One stream of one rank: its file, where its lines go, and what was shown of it."""

    def __init__(self, rank: int, path: str, dest: TextIO) -> None:
        self.rank, self.path, self.dest = rank, path, dest
        self.prefix = line_prefix(rank)
        self.fp: BinaryIO | None = None
        self.line = RedrawnLine()
        self.unshown_update: str | None = None
        self.last_update_line = float("-inf")
        self.live_text = ""

    def read(self) -> bytes:
        if self.fp is None:
            try:
                self.fp = open(self.path, "rb")  # noqa: SIM115 - kept open while the rank runs
            except OSError:
                return b""
        chunks = []
        while chunk := self.fp.read(1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        if self.fp is not None:
            with contextlib.suppress(OSError):
                self.fp.close()
            self.fp = None


class ConsoleRelay:
    """Copies every rank's output files to this console (see the module's docstring).

    ``follow`` names the files of the ranks now running (again after a restart); a thread reads them
    every ``poll_s`` seconds until ``stop``, which prints what is left.
    """

    def __init__(self, stdout: TextIO, stderr: TextIO, interval_s: float = UPDATE_LINE_INTERVAL_S,
                 poll_s: float = POLL_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.stdout, self.stderr = stdout, stderr
        self.interval_s, self.poll_s, self.clock = interval_s, poll_s, clock
        self._sources: list[_Source] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: _Source | None = None
        """The source whose line is drawn live now (None: no live line on the screen)."""

    # --- the console ------------------------------------------------------------------------

    @staticmethod
    def is_terminal(stream: TextIO) -> bool:
        """Whether ``stream`` is a terminal (where a line can be redrawn)."""
        try:
            return stream.isatty()
        except (AttributeError, ValueError, OSError):
            return False

    def is_live(self) -> bool:
        """Whether rank 0's redrawn lines are drawn live here (this process's stdout is a terminal)."""
        return self.is_terminal(self.stdout)

    def worker_variables(self) -> dict[str, str]:
        """Variables for the workers: whether the console is live, and how wide a bar may be."""
        if not self.is_live():
            # said explicitly: a launcher started by a rank of another must not inherit its "1"
            return {LIVE_CONSOLE_VARIABLE: "0"}
        columns = shutil.get_terminal_size((80, 24)).columns
        variables = {LIVE_CONSOLE_VARIABLE: "1"}
        if "TQDM_NCOLS" not in os.environ:  # tqdm bars of the ranks fit beside the "[0] " prefix
            variables["TQDM_NCOLS"] = str(max(columns - len(line_prefix(LIVE_RANK)) - 1, 20))
        return variables

    def _width(self, dest: TextIO) -> int:
        try:
            return os.get_terminal_size(dest.fileno()).columns
        except (AttributeError, ValueError, OSError):
            return 80

    def _write(self, dest: TextIO, text: str) -> None:
        with contextlib.suppress(ValueError, OSError):
            dest.write(text)
            dest.flush()

    def _hide_live(self) -> None:
        if self._live is not None:
            self._write(self._live.dest, "\r" + _ERASE_TO_END)

    def _draw_live(self) -> None:
        live = self._live
        if live is not None:
            # one screen row: a line that wrapped could not be redrawn by a carriage return
            room = self._width(live.dest) - 1
            text = live.prefix + live.live_text
            if len(_ESCAPES.sub("", text)) > room:
                text = _ESCAPES.sub("", text)[:room]
            self._write(live.dest, "\r" + text + _ERASE_TO_END)

    def _print_line(self, source: _Source, text: str) -> None:
        self._hide_live()
        self._write(source.dest, source.prefix + text + "\n")
        self._draw_live()

    def _set_live(self, source: _Source, text: str) -> None:
        if text == source.live_text and self._live is source:
            return
        source.live_text = text
        if not text:
            if self._live is source:
                self._hide_live()
                self._live = None
            return
        if self._live is not source:
            self._hide_live()
            self._live = source
        self._draw_live()

    def say(self, text: str) -> None:
        """Print the launcher's own lines on stderr between whole lines of the ranks' output."""
        with self._lock:
            self._hide_live()
            self._write(self.stderr, text.rstrip("\n") + "\n")
            self._draw_live()

    # --- the ranks' files -------------------------------------------------------------------

    def follow(self, files: Mapping[int, tuple[str | None, str | None]]) -> None:
        """Relay these files from now on: ``{rank: (stdout path, stderr path)}`` (None: kept off the console).

        The files of the ranks followed so far are read to their end first (a restart begins after
        the previous ranks have exited).
        """
        with self._lock:
            self._drain()
            self._sources = [_Source(rank, path, dest) for rank, paths in sorted(files.items())
                             for path, dest in zip(paths, (self.stdout, self.stderr)) if path is not None]

    def start(self) -> ConsoleRelay:
        """Start the thread that copies the files."""
        self._thread = threading.Thread(target=self._run, name="ringtrain-console-relay", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and print everything left, unfinished lines included."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._drain()
            self._sources = []

    def poll(self) -> None:
        """Relay what the files gained since the last look (the thread calls this every ``poll_s``)."""
        with self._lock:
            for source in self._sources:
                self._relay(source)

    def _run(self) -> None:
        while not self._stopped.wait(self.poll_s):
            self.poll()

    def _drain(self) -> None:
        """Relay what the followed files hold, then end their unfinished lines."""
        for source in self._sources:
            self._relay(source)
            self._end(source)
            source.close()

    def _relay(self, source: _Source) -> None:
        data = source.read()
        if not data:
            return
        events = source.line.feed(data)
        if source.rank == LIVE_RANK and self.is_terminal(source.dest):
            for kind, text in events:
                if kind == "line":
                    self._set_live(source, "")
                    self._print_line(source, text)
            self._set_live(source, source.line.current())
            return
        now = self.clock()
        for kind, text in events:
            if kind == "line":
                self._print_line(source, text)
                # the line's final text is out; the next bar starts afresh
                source.unshown_update, source.last_update_line = None, float("-inf")
            elif not text:  # a cleared bar: its last state is the one worth keeping
                if source.unshown_update:
                    self._print_line(source, source.unshown_update)
                source.unshown_update, source.last_update_line = None, float("-inf")
            elif now - source.last_update_line >= self.interval_s:  # the first state, then one per interval
                self._print_line(source, text)
                source.unshown_update, source.last_update_line = None, now
            else:
                source.unshown_update = text

    def _end(self, source: _Source) -> None:
        rest = source.line.current()
        if self._live is source:
            self._set_live(source, "")
        if source.unshown_update and source.unshown_update != rest:
            self._print_line(source, source.unshown_update)
        source.unshown_update = None
        if rest:
            self._print_line(source, rest)
        source.line = RedrawnLine()


class RankLogsSpecs(DefaultLogsSpecs):
    """Redirect all output to files (under ``output_dir/rank.<N>/`` when given) and hand them to ``relay``.

    Every stream always goes to a file (the root-cause report reads them); nothing is teed through
    torch's tailer, ``relay`` prints the files (see the module's docstring). ``redirects`` and ``tee``
    are torchrun's selectors (``"3"`` or ``"0:1,1:2"``) and only decide what the console shows: a
    redirected stream is kept off it, unless it is also teed.
    """

    def __init__(self, log_dir: str, output_dir: str | None = None, redirects: str | None = None,
                 tee: str | None = None, relay: ConsoleRelay | None = None) -> None:
        super().__init__(log_dir=log_dir, redirects=Std.ALL, tee=Std.NONE)
        self.output_dir = output_dir
        self.quiet = Std.from_str(redirects) if redirects else Std.NONE
        self.shown = Std.from_str(tee) if tee else Std.NONE
        self.relay = relay

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        dest = super().reify(envs)
        if self.output_dir:
            for local_rank, env in envs.items():
                folder = os.path.join(self.output_dir,
                                      "rank." + padded_rank(int(env["RANK"]), int(env["WORLD_SIZE"])))
                os.makedirs(folder, exist_ok=True)
                dest.stdouts[local_rank] = os.path.join(folder, "stdout")
                dest.stderrs[local_rank] = os.path.join(folder, "stderr")
                for path in (dest.stdouts[local_rank], dest.stderrs[local_rank]):
                    # a file of an earlier run must not be relayed before the new rank replaces it
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(path)
        if self.relay is not None:
            quiet, shown = to_map(self.quiet, len(envs)), to_map(self.shown, len(envs))
            on_console = {}
            for local_rank, env in envs.items():
                off = quiet[local_rank] & ~shown[local_rank]
                on_console[int(env["RANK"])] = (None if off & Std.OUT else dest.stdouts[local_rank],
                                                None if off & Std.ERR else dest.stderrs[local_rank])
            self.relay.follow(on_console)
        return dest
