"""A Horovod-API script whose rank 1 raises at step 5, and then exits slowly: the root-cause trials' worker.

Rank 1's ``RuntimeError`` goes to its error file with its exact time; its interpreter then stops the
engine at exit (ringtrain's own exit handler), so rank 0's next collective fails with "Horovod has been
shut down" and rank 0 exits. Rank 1 then sleeps in an exit handler registered before ``hvd.init()``
(handlers run last registered first, so it runs after the engine's): rank 0 is sure to exit first, and
the agent stops rank 1 with SIGTERM while it is still exiting. That is the race which, under CPU load,
once made rank 0 the root cause; here it happens every time, without a sleep in the test (the agent's
SIGTERM cuts the sleep short).
"""

import atexit
import os
import time

if os.environ.get("RANK") == "1":
    atexit.register(time.sleep, 20)

import torch  # noqa: E402

import ringtrain as hvd  # noqa: E402

hvd.init()
for step in range(20):
    if step == 5 and hvd.rank() == 1:
        raise RuntimeError("boom at step 5")
    hvd.allreduce(torch.ones(4), name="grad")
print("done", hvd.rank())
