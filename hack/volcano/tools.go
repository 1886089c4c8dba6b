//go:build tools

// Package tools pins the Volcano commands this module builds: vc-scheduler, whose gang plugin
// schedules a PodGroup's pods together.
package tools

import (
	_ "volcano.sh/volcano/cmd/scheduler/app"
)
