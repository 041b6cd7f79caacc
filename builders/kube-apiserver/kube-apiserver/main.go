// kube-apiserver: the release's own server command, built from k8s.io/kubernetes (pinned by the
// modfile), for the tests that check what Kubernetes sees of the warden's restores.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
