// Command libcni-client drives a CNI network configuration list through libcni,
// the library containerd and CRI-O embed, so that cni-dra can be tested exactly
// as those runtimes call it (config injection, prevResult caching, plugin chaining).
//
// Build (Debian 12, packages golang-go and golang-github-appc-cni-dev):
//
//	GOPATH=/usr/share/gocode GO111MODULE=off go build -o libcni-client .
//
// Usage:
//
//	libcni-client -conflist FILE -netns PATH -id CONTAINER [-ifname eth0]
//	    [-args 'IgnoreUnknown=1;K8S_POD_UID=...'] [-path /opt/cni/bin[:dir...]]
//	    [-cache-dir DIR] [-capabilities JSON] add|check|del
//
// On success, ADD prints the result JSON (in the list's cniVersion) on stdout;
// CHECK and DEL print nothing. On failure it prints the plugin's CNI error JSON
// (code, msg, details) on stdout when the plugin returned one, otherwise
// {"code": 999, "msg": ...}; the full error text goes to stderr; exit status 1.
// Usage errors exit 2.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

// parseCNIArgs splits a CNI_ARGS string ("K=V;K=V") into the pairs libcni wants.
func parseCNIArgs(s string) ([][2]string, error) {
	var out [][2]string
	if s == "" {
		return out, nil
	}
	for _, kv := range strings.Split(s, ";") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("bad CNI_ARGS item %q (want KEY=VALUE)", kv)
		}
		out = append(out, [2]string{k, v})
	}
	return out, nil
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "libcni-client: %v\n", err)
	var cniErr *types.Error
	var out []byte
	if errors.As(err, &cniErr) {
		out, _ = json.Marshal(cniErr)
	} else {
		out, _ = json.Marshal(map[string]interface{}{"code": 999, "msg": err.Error()})
	}
	fmt.Println(string(out))
	os.Exit(1)
}

func usage(msg string) {
	fmt.Fprintf(os.Stderr, "libcni-client: %s\n", msg)
	flag.Usage()
	os.Exit(2)
}

func main() {
	conflist := flag.String("conflist", "", "network configuration list file (.conflist)")
	netns := flag.String("netns", "", "network namespace path (CNI_NETNS)")
	containerID := flag.String("id", "", "container ID (CNI_CONTAINERID)")
	ifName := flag.String("ifname", "eth0", "interface name in the container (CNI_IFNAME)")
	cniArgs := flag.String("args", "", "CNI_ARGS, e.g. 'IgnoreUnknown=1;K8S_POD_UID=u'")
	pluginPath := flag.String("path", "/opt/cni/bin", "plugin directories, colon separated (CNI_PATH)")
	cacheDir := flag.String("cache-dir", "", "libcni result cache directory (default /var/lib/cni)")
	capabilities := flag.String("capabilities", "", "capability args as a JSON object (runtimeConfig)")
	timeout := flag.Duration("timeout", 60*time.Second, "deadline for the whole operation")
	flag.Parse()

	if flag.NArg() != 1 {
		usage("want exactly one command: add, check or del")
	}
	if *conflist == "" || *containerID == "" {
		usage("-conflist and -id are required")
	}

	list, err := libcni.ConfListFromFile(*conflist)
	if err != nil {
		fail(err)
	}
	args, err := parseCNIArgs(*cniArgs)
	if err != nil {
		usage(err.Error())
	}
	rt := &libcni.RuntimeConf{
		ContainerID: *containerID,
		NetNS:       *netns,
		IfName:      *ifName,
		Args:        args,
	}
	if *capabilities != "" {
		if err := json.Unmarshal([]byte(*capabilities), &rt.CapabilityArgs); err != nil {
			usage(fmt.Sprintf("bad -capabilities JSON: %v", err))
		}
	}
	var dirs []string
	for _, d := range filepath.SplitList(*pluginPath) {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	cni := libcni.NewCNIConfigWithCacheDir(dirs, *cacheDir, nil)

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	switch flag.Arg(0) {
	case "add":
		result, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			fail(err)
		}
		if err := result.Print(); err != nil {
			fail(err)
		}
		fmt.Println()
	case "check":
		if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
			fail(err)
		}
	case "del":
		if err := cni.DelNetworkList(ctx, list, rt); err != nil {
			fail(err)
		}
	default:
		usage(fmt.Sprintf("unknown command %q", flag.Arg(0)))
	}
}
