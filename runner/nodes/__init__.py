"""Runs over several machines: the node agent, the static and c10d resumes, and SLURM."""
