"""The entrypoint of a DistTrainJob worker with `spec.mpi.bootstrap: Gloo` (bootstrap.py).

The operator mounts bootstrap.py's source into each worker pod from the job's ConfigMap and runs
`python3 /etc/mpi/disttrain_gloo.py -- <the worker's command>`: it needs nothing in the image but
Python 3.8 or later (no sshd, no keys, not even this package), and Horovod for the training itself.
"""
