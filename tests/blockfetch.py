"""What another local user can ask of a Spark block manager: a standard-library client of Spark's
block transfer protocol (``org.apache.spark.network.protocol``), run as ``nobody`` by the
privilege tests. It opens blocks by id (``OpenBlocks`` in an RPC) and fetches their first chunk,
as an executor would -- without the application's secret.

``python3 blockfetch.py HOST PORT BLOCK_ID...`` prints one line per block id: ``GOT <n> bytes``
and the bytes' hex (unpacked when Spark compressed them with LZ4, its default), ``FAILED <why>``
(the server answered with an error: an authenticating one says it expected SASL), or ``REFUSED
<why>`` (the connection was closed or reset). Kept free of imports beyond the standard library, so
it runs under any Python.
"""

from __future__ import annotations

import socket
import struct
import sys

RPC_REQUEST, RPC_RESPONSE, RPC_FAILURE = 3, 4, 5
CHUNK_FETCH_REQUEST, CHUNK_FETCH_SUCCESS, CHUNK_FETCH_FAILURE = 0, 1, 2
OPEN_BLOCKS, STREAM_HANDLE = 0, 3


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">i", len(data)) + data


def _frame(kind: int, header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">qb", 8 + 1 + len(header) + len(body), kind) + header + body


def _read_frame(sock: socket.socket) -> tuple[int, bytes]:
    size = struct.unpack(">q", _exactly(sock, 8))[0]
    if not 9 <= size <= 1 << 28:
        raise ConnectionError(f"a frame of {size} bytes: not Spark's protocol")
    rest = _exactly(sock, size - 8)
    return rest[0], rest[1:]


def _exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        got = sock.recv(n - len(out))
        if not got:
            raise ConnectionError("the server closed the connection")
        out += got
    return out


def fetch(host: str, port: int, block_id: str, app_id: str = "app", exec_id: str = "driver") -> str:
    """One block's fate, as the module docstring's lines say."""
    open_blocks = bytes([OPEN_BLOCKS]) + _string(app_id) + _string(exec_id) + struct.pack(">i", 1) + _string(block_id)
    try:
        with socket.create_connection((host, port), timeout=20) as sock:
            sock.sendall(_frame(RPC_REQUEST, struct.pack(">qi", 1, len(open_blocks)), open_blocks))
            kind, payload = _read_frame(sock)
            if kind == RPC_FAILURE:
                return "FAILED " + payload[12:].decode(errors="replace").splitlines()[0][:200]
            if kind != RPC_RESPONSE or payload[12] != STREAM_HANDLE:
                return f"FAILED unexpected answer of type {kind}"
            stream_id = struct.unpack(">q", payload[13:21])[0]
            sock.sendall(_frame(CHUNK_FETCH_REQUEST, struct.pack(">qi", stream_id, 0)))
            kind, payload = _read_frame(sock)
            if kind != CHUNK_FETCH_SUCCESS:
                return f"FAILED chunk answer of type {kind}"
            data = unpack_lz4(payload[12:])
            return f"GOT {len(data)} bytes {data.hex()}"
    except (OSError, ConnectionError) as exc:
        return f"REFUSED {exc}"


def unpack_lz4(data: bytes) -> bytes:
    """The bytes inside lz4-java's ``LZ4BlockOutputStream`` framing (Spark's default codec), or
    ``data`` as it is when it is not framed so."""
    if not data.startswith(b"LZ4Block"):
        return data
    out, i = bytearray(), 0
    while data.startswith(b"LZ4Block", i):
        method = data[i + 8] & 0xF0
        packed, size = struct.unpack("<ii", data[i + 9:i + 17])
        block = data[i + 21:i + 21 + packed]
        out += block if method == 0x10 else _lz4_block(block)
        i += 21 + packed
        if size == 0:
            break
    return bytes(out)


def _lz4_block(src: bytes) -> bytes:
    out, i = bytearray(), 0
    while i < len(src):
        token = src[i]
        literals, i = _length(src, i + 1, token >> 4)
        out += src[i:i + literals]
        i += literals
        if i >= len(src):
            break
        offset = src[i] | src[i + 1] << 8
        length, i = _length(src, i + 2, token & 15)
        for _ in range(length + 4):
            out.append(out[-offset])
    return bytes(out)


def _length(src: bytes, i: int, nibble: int) -> tuple[int, int]:
    """An LZ4 length: the token's nibble, and when it is 15, the bytes after it up to one below 255."""
    if nibble == 15:
        while True:
            nibble += src[i]
            i += 1
            if src[i - 1] != 255:
                break
    return nibble, i


if __name__ == "__main__":
    for block in sys.argv[3:]:
        print(block, fetch(sys.argv[1], int(sys.argv[2]), block), flush=True)
