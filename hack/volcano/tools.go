//go:build tools

// Package tools pins the commands this module builds: Volcano's vc-scheduler, whose gang plugin
// schedules a PodGroup's pods together, and dra-example-driver's kubelet plugin, the real node's
// fake GPUs (hack/nodedra.py).
package tools

import (
	_ "sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin"
	_ "volcano.sh/volcano/cmd/scheduler/app"
)
