"""Resident memory and open file descriptors of a server's process tree, read from /proc (Linux).

The soak samples these for the server process and every process below it (our server's engine
and tokenizer worker), each by name, because a leak shows up in one process, not in their sum.
The server is found from the port it listens on, so the soak needs no pid from the user.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_TCP_LISTEN = "0A"  # st column of /proc/net/tcp


@dataclass(frozen=True)
class ProcessSample:
    pid: int
    name: str
    rss_bytes: int
    num_fds: int


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def listening_pid(port: int) -> int | None:
    """The pid of the process that holds a listening TCP socket on `port`, or None."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        for line in (_read(PROC / "net" / table) or "").splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == _TCP_LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{inode}]")
    if not inodes:
        return None
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(entry.name)
        except OSError:  # gone, or not ours to read
            continue
    return None


def _stat(pid: int) -> tuple[str, int] | None:
    """(comm, ppid) from /proc/PID/stat; comm may hold spaces and parentheses."""
    text = _read(PROC / str(pid) / "stat")
    if text is None:
        return None
    comm = text[text.index("(") + 1: text.rindex(")")]
    ppid = int(text[text.rindex(")") + 2:].split()[1])
    return comm, ppid


def process_tree(root: int) -> list[tuple[int, str]]:
    """(pid, comm) of `root` and all its descendants, root first."""
    children: dict[int, list[tuple[int, str]]] = {}
    root_comm = None
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            comm, ppid = stat
            children.setdefault(ppid, []).append((int(entry.name), comm))
            if int(entry.name) == root:
                root_comm = comm
    if root_comm is None:
        return []
    tree, unvisited = [(root, root_comm)], [root]  # depth first over the parent -> children map
    while unvisited:
        for child in children.get(unvisited.pop(), []):
            tree.append(child)
            unvisited.append(child[0])
    return tree


def rss_bytes(pid: int) -> int | None:
    for line in (_read(PROC / str(pid) / "status") or "").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


def num_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(PROC / str(pid) / "fd"))
    except OSError:
        return None


def sample_tree(root: int, root_name: str = "server") -> list[ProcessSample]:
    """One sample per live process of the tree; the root is called `root_name` (its comm is
    just the interpreter's name), children by their comm (our children name themselves)."""
    samples = []
    for pid, comm in process_tree(root):
        rss, fds = rss_bytes(pid), num_fds(pid)
        if rss is not None and fds is not None:
            samples.append(ProcessSample(pid, root_name if pid == root else comm, rss, fds))
    return samples
