"""The second floor, pure: from SLURM facts to what a cluster should be.

The port plan, each node's Ray resources and ``ray start`` arguments, the launcher configs
of both providers, the names of steps, jobs and markers, elastic node types as sbatch
requests, what ``status`` says. Imports ``slurm`` only; runs no process, imports no Ray,
so every rule here is tested fast and read alone.
"""
