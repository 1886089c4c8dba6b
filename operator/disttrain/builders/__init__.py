"""Builders: the objects a job's spec asks for (pods, TF_CONFIG, MPI's hostfile and SSH Secret, the
headless Service, gang groups), as plain dicts. Pure functions of the spec; no I/O.
"""
