"""A job too large for its pods to start, failed before anything is made for it.

A TensorFlow pod's TF_CONFIG lists every member of the cluster (builders/tensorflow.py), in one
environment variable that Linux caps at 131,072 bytes: past it, every container of the job fails
to start the same way. The CRD's rules refuse such a job at `kubectl apply` (api/crd_size.py); a job
stored before them is checked here: it fails naming the field, before it is queued (it takes no
quota) and before a pod is built (each would be as large as the whole job).
"""

from __future__ import annotations

from disttrain.api.status import Phase
from disttrain.builders.tensorflow import tf_config_too_large
from disttrain.decide.passes import Pass
from disttrain.decide.reasons import Reason


def refuse_too_large(p: Pass) -> bool:
    tf = p.spec.tensorflow
    trouble = tf_config_too_large(p.job.ref, tf) if tf is not None else None
    return trouble is not None and p.finish(Phase.FAILED, Reason.INVALID_SPEC, str(trouble))
