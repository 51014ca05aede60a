"""The training job: NeoX model + data + sharded engine + loop, logging, checkpoints and plots.

:func:`zerotopo.trainer.entry.run_training` is what ``zerotopo train`` calls: it runs as one rank of a
job launched by ``srun``, ``mpiexec`` or ``torchrun``, or, with no launcher around, spawns the local
emulated cluster of the topology itself.
"""
