#!/bin/bash
# Capture what a Slurm prints for the forms eray-provider parses, into tests/data/slurm-<version>/.
# Run with a test bed up (scripts/slurm-testbed up [--slurm 25.11]) and its environment set:
#   eval "$(scripts/slurm-testbed env)"; tests/data/capture.sh
# The unit tests (test_slurm_forms.py) parse every version's files alike.
set -euo pipefail
version=$(scontrol --version | awk '{print $2}' | cut -d. -f1-2)
out="$(dirname "$0")/slurm-$version"
mkdir -p "$out"

# A job's environment as salloc gives it, and scontrol's record of the job (-d, multi-line)
salloc_forms() {  # name, srun's arguments for one task, salloc's arguments...
    local name=$1 step=$2
    shift 2
    salloc -J interactive "$@" bash -c '
        env | grep -E "^SLURMD?_" | grep -vE "^SLURM_(CONF|SUBMIT_HOST|SUBMIT_DIR)=" | sort
        scontrol show job -d "$SLURM_JOB_ID" > "$0.scontrol"
        scontrol -o show job "$SLURM_JOB_ID" > "$0.scontrol-o"
        srun $1 bash -c "env | grep -E \"^SLURMD?_\" | grep -vE \"^SLURM_(CONF|SUBMIT_HOST|SUBMIT_DIR)=\" | sort" > "$0.step.env"
    ' "$out/$name" "$step" > "$out/$name.salloc.env"
}

salloc_forms typed "-N1 -n1" -N3 -c3 --gpus-per-node=testgpu:1 --mem=1500 --time=30:00
salloc_forms het "--het-group=0 -N1 -n1" -N2 -c2 --mem-per-cpu=500 : -N1 -c1 --gpus-per-node=2 --mem=700

# squeue in the form the elastic provider reads (slurm/squeue.py SQUEUE_FORMAT), a running and a pending job
running=$(sbatch --parsable -J eray.forms.head -c1 --mem=100 -o /dev/null --time=10:00 --wrap "sleep 300")
pending=$(sbatch --parsable -J eray.forms.1.cpu -c1 --mem=100 -o /dev/null --hold --wrap "sleep 300")
for _ in $(seq 1 100); do
    [ "$(squeue -h -j "$running" -o %T)" = RUNNING ] && break
    sleep 0.2
done
squeue -h -a -u "$(id -un)" -j "$running,$pending" -o "%A|%T|%D|%N|%r|%L|%e|%l|%j" > "$out/squeue.txt"
scontrol -o show partition "$(squeue -h -j "$running" -o %P)" > "$out/partition.scontrol-o"
scancel "$running" "$pending"
echo "captured into $out"
