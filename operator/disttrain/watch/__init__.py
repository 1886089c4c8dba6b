"""Where events come in: the operator's own list+watch of its jobs and pods (reflector.py, jobwatch.py,
podwatch.py), and kopf's handlers for Kueue Workloads, its login, start and stop (handlers.py).
"""
