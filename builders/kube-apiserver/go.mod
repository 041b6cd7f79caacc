// Not built as is: scripts/deps.sh builds with -modfile=v1.37.2.mod, which pins the release
// (go needs a go.mod here to find the module's root).
module etcd-warden/builders/kube-apiserver

go 1.26.0
