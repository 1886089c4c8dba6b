//go:build tools

// Package tools pins KWOK's command in this module's graph: hack/build-binaries.sh builds
// sigs.k8s.io/kwok/cmd/kwok here, so that go.mod's replace gives it the guarded easycel
// (easycel v0.6.0 keeps its type caches in plain package maps, and KWOK v0.8.0 fills them from
// its node controller, pod controller and server at once: "fatal error: concurrent map writes"
// at start-up, one start in N; issue 20). The proxy serves no newer KWOK or easycel;
// easycel-guard.patch is the whole change.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
