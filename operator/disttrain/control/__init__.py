"""Carrying out plans: the controller, its work queue, expectations, children, gang groups, Kueue
Workloads, namespace teardown, status writes, the pod re-list's tombstones.
"""
