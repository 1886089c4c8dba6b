"""Every default of the API, in one place.

The CRD generator writes these into the schema (`default:`), so `kubectl get -o yaml` shows
the values in force; the spec parser applies the same ones, so `disttrain render` and the
unit tests see what the API server would have stored.
"""

REPLICAS = 1
REPLICA_RESTART_POLICY = "Never"
TF_PORT = 2222
TF_SUCCESS_POLICY = "ChiefOrWorker0"
MPI_IMPLEMENTATION = "OpenMPI"
MPI_BOOTSTRAP = "SSH"
MPI_SSH_AUTH_MOUNT_PATH = "/root/.ssh"
MPI_LAUNCHER_START = "WhenWorkersReady"
# Elastic MPI (spec.mpi.elastic): how long a worker scaled away stays after it leaves discovery. The
# launcher reads discover_hosts.sh from a ConfigMap volume; the operator touches the launcher after
# each change so the kubelet refreshes it at once (else at its next periodic sync, a minute);
# Horovod runs the script every second and stops the host's ranks at its workers' next commit.
# A worker deleted before that is lost rather than dropped: Horovod resets from the last commit.
ELASTIC_SCALE_DOWN_DELAY_SECONDS = 30
# How long an elastic job may run with fewer than minReplicas workers before its restart policy
# takes over (a replaced worker normally rejoins well within it: a pod start and an sshd).
ELASTIC_BELOW_MIN_GRACE_SECONDS = 120
BACKOFF_LIMIT = 3
CLEAN_POD_POLICY = "Running"
SUSPEND = False
# runPolicy.injectProgressHook: the hook in pods whose image lacks it, where the operator has a hook image.
INJECT_PROGRESS_HOOK = True
# How long a stop the operator chooses (a Kueue eviction or preemption, a suspend, the whole-job
# restart after a drained pod) waits for the training to confirm a checkpoint
# (decide/checkpoint_steps.py). Kueue bounds no integration's stop: a preemptor waits until the
# victim's quota is handed back, and it already waits out the victim pods' graceful termination
# (terminationGracePeriodSeconds, 30 by default). 30 more seconds at most double that wait, and a
# training that saves its state takes seconds (measured on the real node: confirmed 0.4 to 1.2 s
# after the request): an epoch saved is worth the preemptor's half a minute at worst. A drained
# pod gets no notice before SIGTERM: it saves within its own grace period.
CHECKPOINT_GRACE_SECONDS = 30
# Its bound: a job's owner holds Kueue quota against a higher-priority preemptor that long at most
# (Kueue bounds no integration's stop). Ten minutes covers a save of a large model to remote storage.
MAX_CHECKPOINT_GRACE_SECONDS = 600
# runPolicy.onStall: what a stalled job gets (decide/policies/stall.py). Report, because a restart
# is not free and the rule can be wrong: it throws away every step since the job's last checkpoint
# and one of its backoffLimit restarts, and a training can be still for long and healthy (an
# evaluation pass or a checkpoint to slow storage that reports no step, a data loader filling a
# new epoch's shuffle buffer). An existing job upgraded onto this operator keeps running as it did;
# a team that has seen the condition fire only on real hangs turns Restart on per job.
ON_STALL = "Report"
# runPolicy.stallTimeoutSeconds' bounds. Below 10 s the progress hook's own pace (a report every 2 s
# at most) and a status write's 15 s make a healthy job read as still; a week is far past any step.
MIN_STALL_TIMEOUT_SECONDS = 10
MAX_STALL_TIMEOUT_SECONDS = 7 * 24 * 3600
GANG_PROVIDER = "Auto"
NETWORK_EGRESS = "All"
# The schedulers' names a gang provider's pods get unless the job names one (their usual names:
# scheduler-plugins' Helm chart installs this second scheduler; Volcano's is `volcano`).
SCHEDULER_PLUGINS_SCHEDULER = "scheduler-plugins-scheduler"
VOLCANO_SCHEDULER = "volcano"
