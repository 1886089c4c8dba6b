// Command coscheduling-controller: scheduler-plugins' controller, which keeps the status of its
// PodGroups (phase Pending, Scheduling, Running, Finished; pod counts). Built in the control
// plane's module graph (hack/kube).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/spf13/pflag"
	"sigs.k8s.io/scheduler-plugins/cmd/controller/app"
)

func main() {
	options := app.NewServerRunOptions()
	pflag.CommandLine.AddGoFlagSet(flag.CommandLine)
	pflag.Parse()
	if err := app.Run(options); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
