"""Where events come in: kopf's handlers for jobs and Kueue Workloads (handlers.py), and the operator's
own pod watch (podwatch.py).
"""
