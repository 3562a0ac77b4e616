"""Reader (and writer, for tests and the embedded set) of the IDX format used by MNIST and Fashion-MNIST.

An IDX file starts with a big-endian magic ``0x0000TTDD`` (TT: element type, DD: number of
dimensions), then one big-endian uint32 per dimension, then the raw elements.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from ringtrain.exceptions import DataError

# MNIST uses only 0x08 (uint8); the others are in the format and cost nothing to support.
_TYPES: dict[int, npt.DTypeLike] = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"),
                                    0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
_GZIP_MAGIC = b"\x1f\x8b"


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"IDX file {path} does not exist. HINT: check the path or the data folder.") from None
    if raw[:2] == _GZIP_MAGIC:
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError) as err:
            raise DataError(
                f"{path} looks gzipped but cannot be decompressed ({err}). "
                "HINT: the file is truncated or damaged; delete it and copy or download it again."
            ) from None
    return raw


def read_idx(path: str | Path, expect_ndim: int | None = None) -> torch.Tensor:
    """Read a (gzipped or plain) IDX file into a tensor, checking the magic number and the size.

    Raises DataError naming the file when it is not an IDX file of ``expect_ndim`` dimensions.
    """
    path = Path(path)
    raw = _read_bytes(path)
    hint = "HINT: point to the original *-idx?-ubyte(.gz) files; delete and re-fetch a damaged one."
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _TYPES:
        raise DataError(f"{path} is not an IDX file (magic bytes {raw[:4].hex() or 'none'}). {hint}")
    ndim = raw[3]
    if expect_ndim is not None and ndim != expect_ndim:
        raise DataError(f"{path} has {ndim} dimensions, expected {expect_ndim} "
                        f"(magic {struct.unpack('>I', raw[:4])[0]}). {hint}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path} ends inside its IDX header ({len(raw)} bytes). {hint}")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_TYPES[raw[2]])
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        raise DataError(f"{path} holds {len(raw)} bytes but its header {shape} promises {expected}. {hint}")
    array = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return torch.from_numpy(array.astype(dtype.newbyteorder("="), copy=True))


def write_idx(path: str | Path, array: np.ndarray, compress: bool | None = None) -> None:
    """Write a uint8 array as IDX (gzipped when ``compress`` or the name ends in .gz), reproducibly."""
    path = Path(path)
    array = np.ascontiguousarray(array, dtype=np.uint8)
    magic = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    payload = magic + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()
    if compress is None:
        compress = path.suffix == ".gz"
    if compress:
        # mtime=0: the same images give the same bytes, so the embedded files are reproducible
        payload = gzip.compress(payload, compresslevel=9, mtime=0)
    path.write_bytes(payload)
