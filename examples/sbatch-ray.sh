#!/bin/bash
# A Ray cluster for one batch job: every node of the job joins, the driver runs on the
# first node with RAY_ADDRESS and the cluster's token set, and the cluster ends with it.
# Submit: sbatch examples/sbatch-ray.sh [driver.py [args...]]
#SBATCH --job-name=ray-batch
#SBATCH --nodes=3
#SBATCH --cpus-per-task=2
#SBATCH --mem=3000
#SBATCH --time=00:30:00
set -euo pipefail
# eray-provider must come from an environment every node sees (a venv on a shared file system)
exec eray-provider run --timeout 300 -- python "${@:-examples/per_node.py}"
