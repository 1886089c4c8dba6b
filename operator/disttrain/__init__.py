"""disttrain: a Kubernetes operator for distributed TensorFlow and MPI/Horovod training."""

# The one place the version is written: the package's (pyproject reads it), the chart's version and
# appVersion and the operator image's tag follow it (hack/version.py; tests/unit/test_versions.py).
__version__ = "0.2.0"
