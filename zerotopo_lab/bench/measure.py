"""Probes a benchmark row runs inside each rank: memory high-water mark and per-tier link counters.

[Note: peak memory on CPU] Ranks are processes, so a row's peak is the process's resident-set
high-water mark (``VmHWM``), measured by the trainer's probe (:class:`zerotopo.trainer.peak.PeakMemory`):
before each row the previous row's objects are collected, glibc is asked to hand freed pages back
(``malloc_trim``), and the high-water mark is reset to the current resident set (``/proc/self/clear_refs``,
value 5). The row's peak is then ``VmHWM - VmRSS`` at its start: every byte the row held at once (its model
states, gathered weights, activations, communication buffers and the full model it was built from), not
the interpreter and libraries every row shares.
"""

from __future__ import annotations

from zerotopo.trainer.peak import PeakMemory, release_memory

__all__ = ["FRAME_BYTES", "PeakMemory", "link_tier_bytes", "link_tier_counters", "release_memory"]

FRAME_BYTES = 66
"""Headers of one TCP segment as the links' htb classes count it: Ethernet 14, IPv4 20, TCP 20 and its
timestamp option 12 (on by default in Linux). A rank's payload on a link is its bytes less this per
packet (a bare ACK carries none)."""


def link_tier_counters(tier_classes: dict[str, str]) -> dict[str, tuple[int, int]]:
    """Bytes and packets sent so far on this rank's shaped link, per tier (the htb class counters of
    ``eth0`` in the rank's own network namespace); {} when there is no emulated link."""
    if not tier_classes:
        return {}
    from zerotopo.launch.netem import class_counters

    counters = class_counters("eth0")
    return {tier: counters.get(cls, (0, 0)) for tier, cls in tier_classes.items()}


def link_tier_bytes(tier_classes: dict[str, str]) -> dict[str, int]:
    """Bytes sent so far on this rank's shaped link, per tier (:func:`link_tier_counters`)."""
    return {tier: sent for tier, (sent, _) in link_tier_counters(tier_classes).items()}
