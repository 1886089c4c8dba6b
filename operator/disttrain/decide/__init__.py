"""Pure decisions: `reconcile(job, pods, now) -> Plan` and its policies. Functions of the spec, the
observed pods and the clock; no I/O.
"""
