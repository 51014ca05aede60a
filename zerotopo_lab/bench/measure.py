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

__all__ = ["PeakMemory", "link_tier_bytes", "release_memory"]


def link_tier_bytes(tier_classes: dict[str, str]) -> dict[str, int]:
    """Bytes sent so far on this rank's shaped link, per tier (the htb class counters of ``eth0`` in the
    rank's own network namespace); {} when there is no emulated link."""
    if not tier_classes:
        return {}
    from zerotopo.launch.netem import class_bytes

    counters = class_bytes("eth0")
    return {tier: counters.get(cls, 0) for tier, cls in tier_classes.items()}
