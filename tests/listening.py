"""The TCP sockets listening on this machine and the processes that own them, read from /proc (Linux)."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import NamedTuple


class Listener(NamedTuple):
    address: str
    port: int
    pid: int | None


def _hex_address(text: str, v6: bool) -> str:
    raw = bytes.fromhex(text)
    if v6:  # four little-endian 32-bit words
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
        return str(ipaddress.IPv6Address(raw))
    return str(ipaddress.IPv4Address(raw[::-1]))


def _socket_owners() -> dict[int, int]:
    """Socket inode -> pid, for the processes this user may look into."""
    owners: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    owners[int(target[8:-1])] = int(proc.name)
        except OSError:
            continue
    return owners


def listening(pids: set[int] | None = None) -> list[Listener]:
    """Listening TCP sockets (IPv4 and IPv6), optionally only those of ``pids``."""
    owners = _socket_owners()
    out = []
    for name, v6 in (("tcp", False), ("tcp6", True)):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            addr, port = fields[1].split(":")
            pid = owners.get(int(fields[9]))
            if pids is None or pid in pids:
                out.append(Listener(_hex_address(addr, v6), int(port, 16), pid))
    return out


def descendants(pid: int) -> set[int]:
    """``pid`` and every process below it (by /proc/*/stat parent ids)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(proc.name))
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo += children.get(p, [])
    return out


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4 loopback address written as IPv6 (``::ffff:127.0.0.1``)."""
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback
