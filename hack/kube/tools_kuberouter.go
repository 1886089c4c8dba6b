//go:build tools

// kube-router (github.com/cloudnativelabs/kube-router/v2/cmd/kube-router, built by
// hack/build-binaries.sh) shares this module graph: the real node runs its network-policy
// controller alone (hack/netpolicy.py), so NetworkPolicy is enforced there. Its command is a main
// package, which can't be imported, so its imports are, to keep them here. v2.1.0 is the only
// version the proxy serves, and security flaws are reported against it: it is a part of the local
// test node only, never shipped in an image or installed by the chart.
package tools

import (
	_ "github.com/cloudnativelabs/kube-router/v2/pkg/cmd"
	_ "github.com/cloudnativelabs/kube-router/v2/pkg/options"
	_ "github.com/cloudnativelabs/kube-router/v2/pkg/version"
)
