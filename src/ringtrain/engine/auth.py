"""The per-job secret, and the challenge-response that proves it on every connection.

A launcher makes one secret per job (:func:`new_secret`) and hands it to the workers in their
environment (``RINGTRAIN_JOB_SECRET``; never on a command line). The job store
(:mod:`ringtrain.engine.job_store`) and the control plane (:mod:`ringtrain.engine.control_plane`)
accept a connection only once the other side has proven that it knows the secret, and each side
proves it to the other (mutual), so a rank never talks to an impostor that took a peer's address
either.

The proof is an HMAC-SHA256 over a fresh random nonce from *each* side, a role label and whatever
the connection claims (a rank, say)::

    server -> client   nonce_s
    client -> server   nonce_c, HMAC(key, "client" | nonce_s | nonce_c | claims)
    server -> client   HMAC(key, "server" | nonce_s | nonce_c | claims)

A recorded proof is worthless on another connection (the other side's nonce differs every time),
one side's proof cannot be reflected back as the other's (the role labels differ), and a proof for
the store is no proof for the control plane (each purpose derives its own key from the secret).
The secret itself never travels.

A job started without ringtrain's launcher (mpirun, srun, torchrun) and without
``RINGTRAIN_JOB_SECRET`` runs *unauthenticated*: the same handshake with a key everybody can
compute, and one warning line (:func:`warn_unauthenticated`) that says how to fix it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import shlex
import sys
from collections.abc import Mapping

from ringtrain.exceptions import SettingError

#: The variable that carries the secret to the workers.
ENV_SECRET = "RINGTRAIN_JOB_SECRET"
#: The variable that tells workers where their launcher's job store listens (``host:port``).
ENV_ADDRESS = "RINGTRAIN_JOB_STORE"
#: Shortest secret accepted from the environment (characters).
MIN_SECRET_CHARS = 32
#: Bytes of every nonce and every proof.
NONCE_BYTES = 32
PROOF_BYTES = 32

_warned = False


def new_secret() -> str:
    """A fresh per-job secret: 256 random bits as 64 hexadecimal characters."""
    return secrets.token_hex(32)


def secret_from_environ(environ: Mapping[str, str]) -> str | None:
    """The job's secret from ``RINGTRAIN_JOB_SECRET`` in ``environ`` (the process's environment, say);
    None when it is not set (an unauthenticated job).

    A secret shorter than :data:`MIN_SECRET_CHARS` characters is refused with a
    :class:`~ringtrain.exceptions.SettingError`: a guessable secret protects nothing.
    """
    value = environ.get(ENV_SECRET, "").strip()
    if not value:
        return None
    if len(value) < MIN_SECRET_CHARS:
        raise SettingError(
            f"{ENV_SECRET} holds {len(value)} characters; a job secret needs at least {MIN_SECRET_CHARS}. "
            f"HINT: {export_secret_line(keep_existing=False)} (the same on every node), or unset "
            f"{ENV_SECRET} and ringtrain run makes one per job."
        )
    return value


def export_secret_line(python: str = "python3", keep_existing: bool = True) -> str:
    """A shell line that exports a fresh secret unless one is set (for job scripts and hints).

    ``python``: the interpreter the line runs (a job script's own). Used by ``ringtrain script``:
    the nodes of a Slurm job start their ranks separately and must share the secret.
    ``keep_existing`` False: a fresh one even when one is set (the hint for a secret that was refused:
    ``${...:-...}`` would keep the refused value).
    """
    fresh = f"$({shlex.quote(python)} -c 'import secrets; print(secrets.token_hex(32))')"
    if not keep_existing:
        return f'export {ENV_SECRET}="{fresh}"'
    return f'export {ENV_SECRET}="${{{ENV_SECRET}:-{fresh}}}"'


def warn_unauthenticated(what: str) -> None:
    """Say once per process, in one line, that ``what`` runs without a secret and how to fix that."""
    global _warned
    if _warned:
        return
    _warned = True
    print(f"ringtrain: warning: {what} runs unauthenticated: {ENV_SECRET} is not set, so any host that "
          f"can reach its ports can join it. HINT: start it with `ringtrain run`, or give every rank the "
          f"same secret: {export_secret_line()}", file=sys.stderr, flush=True)


def derive_key(secret: str | None, purpose: str) -> bytes:
    """The key of one purpose (``"job store"``, ``"control plane"``, ...) from the job's secret.

    ``secret`` None gives the key of unauthenticated jobs, which anybody can compute.
    """
    material = (secret or "").encode()
    return hmac.new(material, b"ringtrain/" + purpose.encode(), hashlib.sha256).digest()


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def proof(key: bytes, role: bytes, server_nonce: bytes | bytearray, client_nonce: bytes | bytearray,
          claims: bytes | bytearray = b"") -> bytes:
    """What ``role`` (``b"client"`` or ``b"server"``) sends to prove it knows ``key`` on this connection."""
    message = b"|".join((role, server_nonce, client_nonce, claims))
    return hmac.digest(key, message, "sha256")


def session_key(key: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """A key for this connection alone (used to tag the job store's messages)."""
    return hmac.digest(key, b"session|" + server_nonce + client_nonce, "sha256")


def same(a: bytes | bytearray, b: bytes | bytearray) -> bool:
    """Constant-time comparison (no timing hint about how many bytes matched)."""
    return hmac.compare_digest(a, b)
