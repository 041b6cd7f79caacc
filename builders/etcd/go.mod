// Not built as is: scripts/deps.sh builds with -modfile=v3.6.16.mod or -modfile=v3.7.3.mod, which pin
// the release (go needs a go.mod here to find the module's root).
module etcd-warden/builders/etcd

go 1.26.0
