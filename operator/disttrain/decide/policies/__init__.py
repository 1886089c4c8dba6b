"""The rules that decide a job's fate, one module per policy (as kubernetes-sigs/jobset lays them
out): each is a small pure function of the spec, the job's own pods, its status and the clock.
`disttrain.decide.reconcile` calls them in order, as a ladder of named steps.

- success: when the job has succeeded (chief, worker 0, every worker, or the MPI launcher).
- failure: which pod failures are retried, and whether a restart is still within backoffLimit.
- startup: which pods may be created now (the MPI launcher waits for Ready workers).
- deadline: runPolicy.activeDeadlineSeconds.
- ttl: runPolicy.ttlSecondsAfterFinished.
- cleanup: runPolicy.cleanPodPolicy, the pods deleted when the job finishes.
"""
