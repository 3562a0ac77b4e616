"""``ringtrain bench``: the scaling table every tutorial makes by hand, with JSON, CSV, a plot and a model.

A sweep runs a built-in workload (or any script) at several process counts and strategies,
interleaved and repeated, against a single-process baseline; see docs/bench.md. Modules:

- ``plan``: the checked settings and the ordered runs; ``sweep``: running them and writing outputs;
- ``worker`` / ``link``: what runs inside a built-in run / the link probe;
- ``records``: measurements and table rows; ``outputs``: table, JSON, CSV; ``plot``: scaling.png;
- ``folder``: the output folder (an earlier sweep refused or, with ``--overwrite``, cleared; a result
  read back for ``--replot``);
- ``machine``: what it ran on; ``model`` / ``analysis``: the cost model, validation and projection;
- ``hook``: :func:`report`, the one call (or printed line) a user script uses to give its items/s
  (and :func:`parameters_digest`, for the check that its replicas agree); it prints only in the runs
  ``ringtrain bench`` starts, which carry ``RINGTRAIN_BENCH=1`` (:func:`reporting`);
- ``barrier``: the strategy of the ``barrier`` reference (lockstep without gradient exchange);
- ``startup``: a script's start-up, measured, for a script that reports nothing;
- ``estimate``: the sweep's duration, said before it starts.
"""

from ringtrain.bench.hook import ENV_VAR, TAG, parameters_digest, report, reporting

__all__ = ["ENV_VAR", "TAG", "parameters_digest", "report", "reporting"]
