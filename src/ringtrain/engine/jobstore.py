"""The old name of :mod:`ringtrain.engine.job_store`, kept only for launch/elastic_driver.py, which another
change is rewriting; remove this module once that change imports ``job_store``."""

from ringtrain.engine.job_store import (
    ENV_ADDRESS,
    JobStore,
    JobStoreServer,
    join_address,
    new_secret,
    split_address,
)

__all__ = ["ENV_ADDRESS", "JobStore", "JobStoreServer", "join_address", "new_secret", "split_address"]
