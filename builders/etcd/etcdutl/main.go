// etcdutl: the release's own offline tool. Its upstream main package cannot be imported, so this is
// its root command as the release writes it (etcdutl/ctl.go), over the release's etcdutl package.
package main

import (
	"github.com/spf13/cobra"

	"go.etcd.io/etcd/etcdutl/v3/etcdutl"
	"go.etcd.io/etcd/pkg/v3/cobrautl"
)

var rootCmd = &cobra.Command{
	Use:        "etcdutl",
	Short:      "An administrative command line tool for etcd3.",
	SuggestFor: []string{"etcdutl"},
}

func main() {
	cobra.EnablePrefixMatching = true
	rootCmd.PersistentFlags().StringVarP(&etcdutl.OutputFormat, "write-out", "w", "simple", "set the output format (fields, json, protobuf, simple, table)")
	releaseFlags(rootCmd)
	rootCmd.AddCommand(
		etcdutl.NewDefragCommand(),
		etcdutl.NewSnapshotCommand(),
		etcdutl.NewHashKVCommand(),
		etcdutl.NewVersionCommand(),
		etcdutl.NewCompletionCommand(),
		etcdutl.NewMigrateCommand(),
	)
	rootCmd.SetHelpTemplate(`{{.UsageString}}`)
	if err := rootCmd.Execute(); err != nil {
		cobrautl.ExitWithError(cobrautl.ExitError, err)
	}
}
