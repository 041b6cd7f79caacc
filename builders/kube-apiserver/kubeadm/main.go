// kubeadm: the release's own command, built from k8s.io/kubernetes (pinned by the modfile), for the
// tests that render the etcd static pod through kubeadm's phases with the warden's patch.
package main

import (
	"k8s.io/kubernetes/cmd/kubeadm/app"
	utilerrors "k8s.io/kubernetes/cmd/kubeadm/app/util/errors"
)

func main() {
	utilerrors.HandleError(app.Run())
}
