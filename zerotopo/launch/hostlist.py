"""Slurm's compressed host lists and task counts, expanded without calling ``scontrol``.

Slurm writes node lists like ``frontier[00012-00015,00020]`` or ``a[1-3],b5`` and per-node task counts
like ``8(x2),4``. Rank discovery needs the first host (the rendezvous address) and the task count of
every node, and must work where ``scontrol`` is not on the path (inside containers, in unit tests).
"""

from __future__ import annotations

import itertools
import re

from zerotopo.errors import LaunchError

_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets: ``a[1,2],b`` -> ``['a[1,2]', 'b']``."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError("nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("']' without '['")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError("'[' without ']'")
    parts.append(text[start:])
    return parts


#: Most hosts a list may expand to (a host list is never expanded beyond this; one entry is read lazily).
MAX_HOSTS = 1_000_000
#: Most nodes a per-node task count list may describe.
MAX_TASK_NODES = 1_000_000


def _ranges(body: str) -> list[tuple[int, int, int]]:
    """``00012-00015,00020`` -> ``[(12, 15, 5), (20, 20, 5)]``: (low, high, zero-padded width)."""
    out = []
    for item in body.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not m:
            raise ValueError(f"range {item[:40]!r} is neither N nor N-M")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if len(lo) > 18 or len(hi) > 18:
            raise ValueError(f"number {item[:40]!r} is too long for a host name")
        if int(hi) < int(lo):
            raise ValueError(f"range {item!r} runs backwards")
        out.append((int(lo), int(hi), len(lo)))
    return out


def _pattern_choices(pattern: str) -> list[list[tuple[int, int, int]] | str]:
    """One host pattern as fixed text and bracket range sets, without expanding them."""
    pieces = re.split(r"(\[[^\]]*\])", pattern)
    out: list[list[tuple[int, int, int]] | str] = []
    for piece in pieces:
        if piece.startswith("["):
            body = piece[1:-1]
            if not body:
                raise ValueError("empty '[]'")
            out.append(_ranges(body))
        else:
            if "[" in piece or "]" in piece:
                raise ValueError("unbalanced brackets")
            out.append(piece)
    return out


def _count(choices: list[list[tuple[int, int, int]] | str]) -> int:
    total = 1
    for c in choices:
        if not isinstance(c, str):
            total *= sum(hi - lo + 1 for lo, hi, _ in c)
    return total


def _expand_range_set(body: str) -> list[str]:
    """``00012-00015,00020`` -> the numbers as strings, keeping the zero padding of the lower bound."""
    out: list[str] = []
    for item in body.split(","):
        if re.fullmatch(r"\d+", item):
            out.append(item)
            continue
        m = re.fullmatch(r"(\d+)-(\d+)", item)
        if not m:
            raise ValueError(f"range {item!r} is neither N nor N-M")
        lo, hi = m.group(1), m.group(2)
        if int(hi) < int(lo):
            raise ValueError(f"range {item!r} runs backwards")
        # Slurm pads every number to the width of the lower bound ("[08-10]" -> 08, 09, 10).
        width = len(lo)
        out.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return out


def _expand_one(pattern: str) -> list[str]:
    """One host pattern, possibly with several bracket groups: ``r[1-2]n[01-02]`` -> 4 hosts."""
    pieces = re.split(r"(\[[^\]]*\])", pattern)
    choices: list[list[str]] = []
    for piece in pieces:
        if piece.startswith("["):
            body = piece[1:-1]
            if not body:
                raise ValueError("empty '[]'")
            choices.append(_expand_range_set(body))
        else:
            if "[" in piece or "]" in piece:
                raise ValueError("unbalanced brackets")
            choices.append([piece])
    return ["".join(combo) for combo in itertools.product(*choices)]


def expand_hostlist(hostlist: str, *, variable: str = "host list") -> list[str]:
    """Expand a Slurm host list into host names, in Slurm's order.

    ``frontier[00012-00013,00020]`` -> ``['frontier00012', 'frontier00013', 'frontier00020']``;
    ``a[1-3],b5`` -> ``['a1', 'a2', 'a3', 'b5']``; ``node[01-02]-ib`` -> ``['node01-ib', 'node02-ib']``.
    Raises :class:`LaunchError` naming ``variable`` when the list cannot be parsed.
    """
    text = hostlist.strip()
    try:
        patterns = _patterns(text)
        total = sum(_count(_pattern_choices(p)) for p in patterns)
        if total > MAX_HOSTS:
            raise ValueError(f"it names {total} hosts, more than {MAX_HOSTS}")
        hosts: list[str] = []
        for pattern in patterns:
            hosts.extend(_expand_one(pattern))
    except ValueError as exc:
        raise _bad(variable, hostlist, exc) from None
    return hosts


def _patterns(text: str) -> list[str]:
    if not text:
        raise ValueError("it is empty")
    patterns = _split_top_level(text)
    if any(not p for p in patterns):
        raise ValueError("empty entry between commas")
    return patterns


def _bad(variable: str, hostlist: str, exc: Exception) -> LaunchError:
    shown = hostlist if len(hostlist) <= 80 else hostlist[:77] + "..."
    return LaunchError(
        f"{variable}={shown!r} is not a Slurm host list ({exc}); expected a form like "
        "'frontier[00012-00015,00020]' or 'a[1-3],b5'. Check the variable or unset it."
    )


def count_hosts(hostlist: str, *, variable: str = "host list") -> int:
    """How many hosts a Slurm host list names, counted without expanding it."""
    try:
        return sum(_count(_pattern_choices(p)) for p in _patterns(hostlist.strip()))
    except ValueError as exc:
        raise _bad(variable, hostlist, exc) from None


def first_host(hostlist: str, *, variable: str = "host list") -> str:
    """The first host of a Slurm host list (the rendezvous host of a job), read without expanding the
    list: ``nid[0-99999999]`` costs as little as ``nid0``. The whole list is still checked for syntax."""
    try:
        patterns = _patterns(hostlist.strip())
        choices = [_pattern_choices(p) for p in patterns]  # syntax of every entry
    except ValueError as exc:
        raise _bad(variable, hostlist, exc) from None
    return "".join(c if isinstance(c, str) else str(c[0][0]).zfill(c[0][2]) for c in choices[0])


def parse_tasks_per_node(value: str, *, variable: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Expand Slurm's per-node task counts: ``8(x2),4`` -> ``[8, 8, 4]``; ``8,8`` -> ``[8, 8]``."""
    counts: list[int] = []
    for item in value.strip().split(","):
        m = _TASKS_ITEM.match(item.strip())
        if not m or int(m.group(1)) == 0 or (m.group(2) is not None and int(m.group(2)) == 0):
            raise LaunchError(
                f"{variable}={value[:80]!r} is not a per-node task count list; expected forms like '8(x2)', "
                "'8,8' or '8(x2),4' with positive counts."
            )
        repeat = int(m.group(2) or 1)
        if len(counts) + repeat > MAX_TASK_NODES:
            raise LaunchError(
                f"{variable}={value[:80]!r} describes more than {MAX_TASK_NODES} nodes; check the variable."
            )
        counts.extend([int(m.group(1))] * repeat)
    return counts
