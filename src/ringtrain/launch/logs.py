"""Where worker output goes: the console with a ``[rank]`` prefix, and optionally per-rank files.

The elastic agent tees each worker's stdout/stderr into files and prints them with a line prefix.
With ``--output-filename DIR`` the files are horovodrun's ``DIR/rank.<padded>/stdout|stderr``; otherwise
they live in a private temporary folder that the launcher removes afterwards.
"""

from __future__ import annotations

import os

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
from torch.distributed.elastic.multiprocessing.api import LogsDest, to_map

LINE_PREFIX = "[${rank}] "


def padded_rank(rank: int, size: int) -> str:
    """Rank with as many digits as the largest rank, as horovodrun names its output folders."""
    return str(rank).zfill(len(str(max(size - 1, 0))))


class RankLogsSpecs(DefaultLogsSpecs):
    """Tee all output; put the files under ``output_dir/rank.<N>/`` when an output folder is given.

    Every stream always goes to a file (the root-cause report reads them). ``redirects`` and ``tee``
    are torchrun's selectors (``"3"`` or ``"0:1,1:2"``) and only decide what the console shows: a
    redirected stream is kept off it, unless it is also teed.
    """

    def __init__(self, log_dir: str, output_dir: str | None = None, redirects: str | None = None,
                 tee: str | None = None) -> None:
        super().__init__(log_dir=log_dir, tee=Std.ALL)
        self.output_dir = output_dir
        self.quiet = Std.from_str(redirects) if redirects else Std.NONE
        self.shown = Std.from_str(tee) if tee else Std.NONE

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        dest = super().reify(envs)
        quiet, shown = to_map(self.quiet, len(envs)), to_map(self.shown, len(envs))
        for local_rank in envs:
            off_console = quiet[local_rank] & ~shown[local_rank]
            if off_console & Std.OUT:
                dest.tee_stdouts.pop(local_rank, None)
            if off_console & Std.ERR:
                dest.tee_stderrs.pop(local_rank, None)
        if self.output_dir:
            for local_rank, env in envs.items():
                folder = os.path.join(self.output_dir,
                                      "rank." + padded_rank(int(env["RANK"]), int(env["WORLD_SIZE"])))
                os.makedirs(folder, exist_ok=True)
                for name, outs, tees in (("stdout", dest.stdouts, dest.tee_stdouts),
                                         ("stderr", dest.stderrs, dest.tee_stderrs)):
                    outs[local_rank] = os.path.join(folder, name)
                    if local_rank in tees:
                        tees[local_rank] = outs[local_rank]
        return dest
