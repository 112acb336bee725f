"""The third floor: what spawns processes and what they share.

The cluster's state on disk, launching and tearing down Ray steps, the node process
(``node_run``) and its helpers (probes, bind shim, end watch, logs), ``eray-provider run``,
``auto_ray_cluster``, the dashboard relay and ``status``. Imports ``slurm`` and ``plan``;
Ray's private imports live in ``ray_compat`` alone.
"""
