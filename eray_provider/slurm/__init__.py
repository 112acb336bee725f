"""The bottom floor: SLURM's facts and the one client of SLURM's commands.

Hostlists, the allocation model, what ``scontrol``/``squeue`` print and what the ``SLURM_*``
variables say, read from a ``Mapping`` (pure), plus ``client`` and ``srun``: the only
modules of this floor that run processes (SLURM's commands, each with a timeout). Nothing
here imports Ray or a module of a floor above.
"""
