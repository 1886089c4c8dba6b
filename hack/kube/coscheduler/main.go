// Command coscheduler: kube-scheduler v1.36 with scheduler-plugins' Coscheduling plugin
// (sigs.k8s.io/scheduler-plugins), for gang scheduling with its scheduling.x-k8s.io PodGroups.
// Built in the control plane's module graph (hack/kube); run beside the default scheduler with a
// profile of its own (hack/localcluster.py).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	_ "sigs.k8s.io/scheduler-plugins/apis/config/scheme"
	"sigs.k8s.io/scheduler-plugins/pkg/coscheduling"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand(app.WithPlugin(coscheduling.Name, coscheduling.New))))
}
