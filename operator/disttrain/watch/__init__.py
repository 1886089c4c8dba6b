"""Where events come in: the operator's own list+watch of its jobs, its pods and Kueue's Workloads
(reflector.py, jobwatch.py, podwatch.py, workloadwatch.py); kopf logs in, starts and stops them (handlers.py).
"""
