"""Names that make up the API: group, kind, labels, environment variables."""

GROUP = "disttrain.dev"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DistTrainJob"
PLURAL = "disttrainjobs"
SINGULAR = "disttrainjob"
SHORT_NAME = "dtj"
CATEGORY = "disttrain"

JOB_NAME_LABEL = f"{GROUP}/job-name"
REPLICA_TYPE_LABEL = f"{GROUP}/replica-type"
# On a pod that has the checkpoint-request file (builders/checkpoint.py): one made before that
# file existed can't hear a request, and a stop doesn't wait on it.
CHECKPOINT_FILE_LABEL = f"{GROUP}/checkpoint-file"
# A pod's checkpoint request (decide/checkpoint_steps.py), which its checkpoint-request file shows.
CHECKPOINT_REQUEST_ANNOTATION = f"{GROUP}/checkpoint-request"
REPLICA_INDEX_LABEL = f"{GROUP}/replica-index"
# On an elastic MPI job's launcher: the digest of the discover_hosts.sh it should see (Elastic MPI).
DISCOVERY_ANNOTATION = f"{GROUP}/discovery"

TF_CONFIG_ENV = "TF_CONFIG"
JOB_NAME_ENV = "DISTTRAIN_JOB_NAME"
REPLICA_TYPE_ENV = "DISTTRAIN_REPLICA_TYPE"
REPLICA_INDEX_ENV = "DISTTRAIN_REPLICA_INDEX"
NUM_WORKERS_ENV = "DISTTRAIN_NUM_WORKERS"
OMP_NUM_THREADS_ENV = "OMP_NUM_THREADS"

GPU_RESOURCE = "nvidia.com/gpu"
# The status field keeping the GPUs an MPI worker gets through its DRA claims (control/claims.py).
CLAIMED_GPUS = "claimedGPUsPerWorker"
MAX_DNS_LABEL = 63
FIELD_MANAGER = "disttrain-operator"
# spec.managedBy: this operator's own value (the same as leaving it unset), and Kueue's MultiKueue
# controller's, which Kueue v0.19.2's generic adapter for external kinds reads at `.spec.managedBy`
# (pkg/controller/admissionchecks/multikueue/externalframeworks/adapter.go, IsJobManagedByKueue).
MANAGED_BY_DISTTRAIN = f"{GROUP}/operator"
MANAGED_BY_MULTIKUEUE = "kueue.x-k8s.io/multikueue"

# DRA (resource.k8s.io/v1): a claim is never allocated more than 32 devices (AllocationResultsMaxSize);
# a pod template's resourceClaims are bounded by the CRD (MAX_CLAIMS); a claim entry names its
# ResourceClaim or ResourceClaimTemplate by a DNS subdomain, as the pod's API checks it.
MAX_DEVICES_PER_CLAIM = 32
MAX_CLAIMS = 32

# The most pods of one replica type (and an elastic job's maxReplicas), refused above at `kubectl
# apply`: what the operator does per pass grows with it (the pods it lists, the names it wants),
# and an MPI job's hostfile, one line a worker in a ConfigMap, must fit the 1 MiB an object may
# hold: 10,000 of the shortest lines do (`j-worker-9999.j.n.svc slots=8`), 20,000 would not with
# ordinary names. Unbounded, `replicas: 100000` made `disttrain render` grow to 23.5 GB. What a
# TensorFlow pod's environment can hold is smaller, and depends on the job's name and namespace:
# the operator checks it per job (decide/size_steps.py).
MAX_REPLICAS = 10_000
CLAIM_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
