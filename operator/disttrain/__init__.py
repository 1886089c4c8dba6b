"""disttrain: a Kubernetes operator for distributed TensorFlow and MPI/Horovod training."""

__version__ = "0.1.0"
