"""The lab beside the zerotopo library: what compares zerotopo with other frameworks and with the papers.

- :mod:`zerotopo_lab.bench`: the head-to-head (``zerotopo bench compare`` / ``scale`` / ``step``): zerotopo's
  plans against DeepSpeed ZeRO-3 / hpZ and PyTorch FSDP2 on one emulated cluster, the emulated device clock,
  the replayed Frontier curves;
- :mod:`zerotopo_lab.deepspeed_schedule` and :mod:`zerotopo_lab.presets`: DeepSpeed's step schedule as the
  cost model prices it, and the DeepSpeed cost presets (``zerotopo plan --plans deepspeed-zero3,...``);
- :mod:`zerotopo_lab.papers`: the papers' published figures against the cost model's bands
  (``zerotopo plan --validate papers``).

It ships in the ``zerotopo`` distribution as its own package; its dependencies (DeepSpeed, matplotlib) are
the ``lab`` extra: ``pip install 'zerotopo[lab]'``. The library never imports it (tests/test_layers.py);
the ``zerotopo`` command finds it through the ``zerotopo.lab`` entry point (:mod:`zerotopo.cli.lab`), which
names :func:`zerotopo_lab.cli.commands`.
"""
