"""Where worker output goes: the console with a ``[rank]`` prefix, and optionally per-rank files.

The elastic agent tees each worker's stdout/stderr into files and prints them with a line prefix.
With ``--output-filename DIR`` the files are horovodrun's ``DIR/rank.<padded>/stdout|stderr``; otherwise
they live in a private temporary folder that the launcher removes afterwards.
"""

from __future__ import annotations

import os

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
from torch.distributed.elastic.multiprocessing.api import LogsDest

LINE_PREFIX = "[${rank}] "


def padded_rank(rank: int, size: int) -> str:
    """Rank with as many digits as the largest rank, as horovodrun names its output folders."""
    return str(rank).zfill(len(str(max(size - 1, 0))))


class RankLogsSpecs(DefaultLogsSpecs):
    """Tee all output; put the files under ``output_dir/rank.<N>/`` when an output folder is given."""

    def __init__(self, log_dir: str, output_dir: str | None = None) -> None:
        super().__init__(log_dir=log_dir, tee=Std.ALL)
        self.output_dir = output_dir

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        dest = super().reify(envs)
        if self.output_dir:
            for local_rank, env in envs.items():
                folder = os.path.join(self.output_dir,
                                      "rank." + padded_rank(int(env["RANK"]), int(env["WORLD_SIZE"])))
                os.makedirs(folder, exist_ok=True)
                for name, outs, tees in (("stdout", dest.stdouts, dest.tee_stdouts),
                                         ("stderr", dest.stderrs, dest.tee_stderrs)):
                    outs[local_rank] = os.path.join(folder, name)
                    tees[local_rank] = outs[local_rank]
        return dest
