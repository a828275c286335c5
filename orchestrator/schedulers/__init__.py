"""Schedulers: who runs the job loop (``run.py``), and where.

    local    this process runs the plan's jobs one after another (``run.run_plan``)
    slurm    the plan becomes one Slurm job array; each task runs the same loop for
             one job on its node (``slurm.py``), and the submitter follows the array
             and stores a row for every task Slurm ended without one
"""
