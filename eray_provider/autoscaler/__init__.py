"""The top floor: what Ray's cluster launcher and autoscaler call.

``SlurmNodeProvider`` (a fixed allocation), ``SlurmJobProvider`` (elastic: one SLURM job per
worker), the command runner over srun, and their caches: thin adapters over the floors
below. Users name the providers as ``eray_provider.SlurmNodeProvider`` and
``eray_provider.SlurmJobProvider``.
"""
