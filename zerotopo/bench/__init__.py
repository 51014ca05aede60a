"""Measurements of the machine the cost model prices with: every collective on the shard groups of every
tier (:mod:`zerotopo.bench.collectives`, ``zerotopo bench collectives``) and the bandwidth curves
``zerotopo calibrate`` fits from them (:mod:`zerotopo.bench.curves`).

The head-to-head against other frameworks, the emulated device clock and the papers' bands are the lab's
(the ``zerotopo_lab`` package beside this one, ``pip install 'zerotopo[lab]'``); nothing here imports it.
"""
