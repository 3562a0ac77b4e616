"""Bad values for each kind of knob of :mod:`ringtrain.engine.settings`: the settings tests give each
knob those of its kind and expect a clear refusal. A new kind needs its examples here."""

from __future__ import annotations

import os

from ringtrain.engine.settings import Choice, Interfaces, Kind, Number, Switch, TimelineFile


def bad_examples(kind: Kind) -> list[str]:
    """Values a knob of this kind must refuse."""
    if isinstance(kind, Number):
        examples = ["many", "nan", "inf", f"{kind.minimum - 5:g}"]
        if kind.above:
            examples.append(f"{kind.minimum:g}")
        if kind.whole:
            examples.append(f"{kind.minimum + 2.5:g}")
        return examples
    if isinstance(kind, Choice):
        return ["mpi", ",".join(kind.options)]
    if isinstance(kind, Switch):
        return ["maybe", "enabled"]
    if isinstance(kind, TimelineFile):
        return [os.curdir + os.sep, os.path.abspath(os.curdir)]
    if isinstance(kind, Interfaces):
        return ["no-such-if0", "lo,no-such-if0"]
    raise TypeError(f"no bad examples for {type(kind).__name__}: add them to {__name__}")
